//! Turns token bytes into text that is safe to send: whole UTF-8 characters only, and never
//! any part of a stop sequence, even one that spans several tokens.

/// What one push produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Text that can go to the client now.
    pub text: String,
    /// A stop sequence matched; generation must end and nothing after it is sent.
    pub stopped: bool,
}

/// Incremental detokenized text with stop-sequence holdback.
#[derive(Debug, Default)]
pub struct TextStream {
    /// Bytes of a UTF-8 character split across tokens.
    partial: Vec<u8>,
    /// Decoded text that could still be the start of a stop sequence.
    held: String,
    stops: Vec<String>,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// Feeds the bytes of one token.
    pub fn push(&mut self, bytes: &[u8]) -> Piece {
        self.partial.extend_from_slice(bytes);
        let decoded = take_complete_utf8(&mut self.partial);
        self.held.push_str(&decoded);
        self.release(false)
    }

    /// Ends the stream: whatever is held goes out (a dangling partial character as U+FFFD).
    pub fn finish(&mut self) -> Piece {
        if !self.partial.is_empty() {
            let rest = String::from_utf8_lossy(&self.partial).into_owned();
            self.partial.clear();
            self.held.push_str(&rest);
        }
        self.release(true)
    }

    fn release(&mut self, at_end: bool) -> Piece {
        if let Some(pos) = self.earliest_stop() {
            let text = self.held[..pos].to_string();
            self.held.clear();
            return Piece {
                text,
                stopped: true,
            };
        }
        let keep = if at_end { 0 } else { self.holdback() };
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Piece {
            text,
            stopped: false,
        }
    }

    fn earliest_stop(&self) -> Option<usize> {
        self.stops.iter().filter_map(|s| self.held.find(s)).min()
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop sequence.
    fn holdback(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for k in (best + 1..=max).rev() {
                let start = self.held.len() - k;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

/// Decodes the longest valid prefix of `buf`, leaving an incomplete trailing character in it.
/// Invalid bytes become U+FFFD rather than stalling the stream.
fn take_complete_utf8(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&buf[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = buf.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                // Safe: from_utf8 vouched for these bytes.
                out.push_str(std::str::from_utf8(&buf[start..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        start = valid + bad;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], tokens: &[&[u8]]) -> (String, bool) {
        let mut ts = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for t in tokens {
            let p = ts.push(t);
            out.push_str(&p.text);
            if p.stopped {
                return (out, true);
            }
        }
        let p = ts.finish();
        out.push_str(&p.text);
        (out, p.stopped)
    }

    #[test]
    fn plain_text_passes_through() {
        assert_eq!(run(&[], &[b"Hel", b"lo"]), ("Hello".into(), false));
    }

    #[test]
    fn stop_inside_one_token_cuts_before_it() {
        assert_eq!(run(&["END"], &[b"abcENDxyz"]), ("abc".into(), true));
    }

    #[test]
    fn stop_across_token_boundaries_never_leaks() {
        let mut ts = TextStream::new(vec!["\n\nUser:".into()]);
        let a = ts.push(b"Hi.\n");
        assert_eq!(a.text, "Hi.");
        let b = ts.push(b"\nUs");
        assert_eq!(b.text, "");
        let c = ts.push(b"er: more");
        assert_eq!(
            c,
            Piece {
                text: "".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn held_text_is_released_when_the_stop_does_not_follow() {
        assert_eq!(run(&["STOP"], &[b"ST", b"ART"]), ("START".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &[b"xxab"]), ("xx".into(), true));
    }

    #[test]
    fn multibyte_character_split_across_tokens_is_joined() {
        let snow = "☃".as_bytes();
        assert_eq!(
            run(&[], &[&snow[..1], &snow[1..2], &snow[2..]]),
            ("☃".into(), false)
        );
    }

    #[test]
    fn partial_character_is_not_emitted_early() {
        let mut ts = TextStream::new(vec![]);
        let p = ts.push(&"é".as_bytes()[..1]);
        assert_eq!(p.text, "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        assert_eq!(run(&[], &[b"a\xffb"]), ("a\u{fffd}b".into(), false));
    }

    #[test]
    fn dangling_partial_character_at_end_is_replaced() {
        assert_eq!(run(&[], &[b"a\xe2\x98"]), ("a\u{fffd}".into(), false));
    }

    #[test]
    fn stop_made_of_multibyte_characters_matches() {
        assert_eq!(
            run(&["。終"], &["文。".as_bytes(), "終わり".as_bytes()]),
            ("文".into(), true)
        );
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        assert_eq!(run(&[""], &[b"abc"]), ("abc".into(), false));
    }
}
