//! The model's text through the tool-call parsers of every form (Hermes, Llama 3, Mistral):
//! whole (`tools::parse`, the non-streamed answer) and trickled through `ToolStream` in
//! arbitrary pieces (the streamed answer). Both answers must say the same: the same content
//! (whitespace-only content counting as none, as `parse` has it) and the same calls with
//! the same arguments.
//!
//! Input: one byte choosing the form and seeding the piece sizes, then the text.

#![no_main]

use inferloopd::tools::{self, Format, Out, ToolCall, ToolStream};
use libfuzzer_sys::fuzz_target;

const FORMATS: [Format; 3] = [Format::Hermes, Format::Llama3, Format::Mistral];

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let format = FORMATS[first as usize % FORMATS.len()];
    let text = String::from_utf8_lossy(rest);
    let whole = tools::parse(&text, format);

    // One character at a time: every split point at once.
    let chars: Vec<String> = text.chars().map(String::from).collect();
    assert_same(
        &whole,
        &trickle(format, chars.iter().map(String::as_str)),
        "by character",
    );

    // Pieces of 1 to 8 characters, their sizes drawn from the first byte.
    let mut seed = u32::from(first) | 1;
    let mut pieces = Vec::new();
    let mut rest = text.as_ref();
    while !rest.is_empty() {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = 1 + (seed >> 16) as usize % 8;
        let cut = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    assert_same(&whole, &trickle(format, pieces.into_iter()), "in pieces");
});

/// What a client of the stream puts together: the content deltas and each call's name
/// and argument deltas.
fn trickle<'a>(
    format: Format,
    pieces: impl Iterator<Item = &'a str>,
) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = ToolStream::new(format);
    let mut outs = Vec::new();
    for p in pieces {
        outs.extend(stream.push(p));
    }
    outs.extend(stream.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for o in outs {
        match o {
            Out::Content(c) => content.push_str(&c),
            Out::CallStart(name) => calls.push(ToolCall {
                name,
                arguments: String::new(),
            }),
            Out::CallArgs(a) => match calls.last_mut() {
                Some(last) => last.arguments.push_str(&a),
                None => panic!("arguments before any call: {a:?}"),
            },
            Out::Call(c) => calls.push(c),
        }
    }
    let content = (!content.trim().is_empty()).then_some(content);
    (content, calls)
}

fn assert_same(
    whole: &(Option<String>, Vec<ToolCall>),
    streamed: &(Option<String>, Vec<ToolCall>),
    how: &str,
) {
    assert_eq!(whole, streamed, "whole vs streamed {how}");
}
