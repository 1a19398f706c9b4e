//! Unit tests of prompt assembly that need no model: the size bounds, where long text is
//! cut for tokenizing, and the sentinels.

use super::bounds::PromptBounds;
use super::error::PromptError;
use super::sentinels::Sentinels;
use super::tokens::{chunk_end, CHUNK_BYTES};
use super::turn::ChatTurn;

fn bounds() -> PromptBounds {
    PromptBounds {
        min_tokens_per_message: 5,
        max_bytes_per_token: 16,
    }
}

fn turns(n: usize, content: &str) -> Vec<ChatTurn> {
    (0..n)
        .map(|_| ChatTurn {
            role: "user".into(),
            content: content.into(),
            ..ChatTurn::default()
        })
        .collect()
}

#[test]
fn message_count_is_bounded_by_the_context() {
    let b = bounds();
    assert_eq!(b.max_messages(2048), 409);
    assert!(b.check_chat(&turns(409, "a"), 2048).is_ok());
    let err = b.check_chat(&turns(20_000, "a"), 2048).unwrap_err();
    assert!(err.is_too_long());
    assert_eq!(
        err,
        PromptError::TooManyMessages {
            count: 20_000,
            max: 409,
            ctx: 2048,
            per_message: 5
        }
    );
}

#[test]
fn text_bytes_are_bounded_by_the_context() {
    let b = bounds();
    assert!(b.check_bytes(2048 * 16, 2048).is_ok());
    assert!(matches!(
        b.check_bytes(2048 * 16 + 1, 2048),
        Err(PromptError::TooManyBytes { max: 32768, .. })
    ));
    let one_big = turns(1, &"x".repeat(40_000));
    assert!(b.check_chat(&one_big, 2048).unwrap_err().is_too_long());
}

#[test]
fn chunks_end_before_a_space_between_two_words() {
    assert_eq!(chunk_end("short text"), None);
    let text = format!("{}  x yz", "a".repeat(CHUNK_BYTES));
    let end = chunk_end(&text).expect("a word boundary");
    assert_eq!(&text[end..], " yz", "not inside the double space");
    assert_eq!(chunk_end(&"b".repeat(CHUNK_BYTES * 2)), None);
}

#[test]
fn sentinels_never_occur_in_contents() {
    let t = turns(3, "hello \u{E000} world");
    let s = Sentinels::for_turns(&t);
    assert!(t.iter().all(|m| !m.content.contains(&s.of(0))));
    assert_ne!(s.of(1), s.of(11));
    assert!(!s.of(1).contains(&s.of(11)) && !s.of(11).starts_with(&s.of(1)));
}
