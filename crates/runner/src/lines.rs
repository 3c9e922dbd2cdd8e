//! Splitting an agent's output into lines, with a bound: sans-IO, fed with whatever chunks the
//! backend delivers (Docker log frames, pipe reads). A line longer than the bound is reported as
//! oversize, with its length and its first bytes, without ever holding more than the bound in
//! memory; [`salvage`] reads what it can of such a line, so a huge reply or error is cut, not lost.

use turnpike_core::wire::{AgentLine, AgentStatus};

/// The longest line the agent protocol accepts whole.
pub const MAX_LINE: usize = 1 << 20;

/// Bytes of an oversize line kept for [`salvage`]: below the default `message_max_bytes`, so a
/// salvaged reply is cut once.
pub const OVERSIZE_HEAD: usize = 48 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// Not UTF-8; the bytes are dropped.
    NotUtf8 {
        len: usize,
    },
    /// Longer than the bound: its length, and its first bytes (lossily decoded).
    Oversize {
        len: usize,
        head: String,
    },
}

#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    /// Inside an oversize line: bytes seen so far, and its head; nothing else buffered.
    discarding: Option<(usize, Vec<u8>)>,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            buf: Vec::new(),
            discarding: None,
        }
    }

    fn oversize((len, head): (usize, Vec<u8>)) -> Line {
        Line::Oversize {
            len,
            head: String::from_utf8_lossy(&head).into_owned(),
        }
    }

    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let (part, rest, complete) = match newline {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            if let Some((seen, _)) = self.discarding.as_mut() {
                *seen += part.len();
                if complete {
                    out.extend(self.discarding.take().map(Self::oversize));
                }
                continue;
            }
            if self.buf.len() + part.len() > self.max {
                let total = self.buf.len() + part.len();
                let keep = self.max.min(OVERSIZE_HEAD);
                let mut head = std::mem::take(&mut self.buf);
                let room = keep.saturating_sub(head.len());
                head.extend_from_slice(&part[..part.len().min(room)]);
                head.truncate(keep);
                self.discarding = Some((total, head));
                if complete {
                    out.extend(self.discarding.take().map(Self::oversize));
                }
                continue;
            }
            self.buf.extend_from_slice(part);
            if complete {
                out.push(self.take_line());
            }
        }
        out
    }

    /// End of output: a last line without a newline still counts.
    pub fn finish(&mut self) -> Option<Line> {
        if let Some(d) = self.discarding.take() {
            return Some(Self::oversize(d));
        }
        if self.buf.is_empty() {
            return None;
        }
        Some(self.take_line())
    }

    fn take_line(&mut self) -> Line {
        let bytes = std::mem::take(&mut self.buf);
        let len = bytes.len();
        match String::from_utf8(bytes) {
            Ok(mut s) => {
                if s.ends_with('\r') {
                    s.pop();
                }
                Line::Text(s)
            }
            Err(_) => Line::NotUtf8 { len },
        }
    }
}

/// What can be read of an oversize line from its head: the line's type, and its text or error
/// cut where the head ends, with a marker saying how long the line was. `None` if the head does not
/// say what the line is. Lenient by design: the rest of the JSON is gone.
pub fn salvage(head: &str, len: usize) -> Option<AgentLine> {
    let cut = |text: String| format!("{text} … [cut: the line was {len} bytes]");
    match json_string_after(head, "type")?.as_str() {
        "message" => Some(AgentLine::Message {
            text: cut(json_string_after(head, "text")?),
        }),
        "status" => Some(AgentLine::Status {
            text: cut(json_string_after(head, "text")?),
        }),
        "result" => {
            let status = match json_string_after(head, "status").as_deref() {
                Some("ok") => AgentStatus::Ok,
                // An error whose status or text was cut off is still the agent's error.
                _ => AgentStatus::Error,
            };
            let error = json_string_after(head, "error").map(cut);
            Some(AgentLine::Result { status, error })
        }
        _ => None,
    }
}

/// The string value of `"key"` in a JSON object's text, decoded up to its closing quote or to the
/// end of `text`, whichever comes first.
fn json_string_after(text: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\"");
    // The key is the occurrence followed by a colon (`"status":"error"` holds `"error"` as a value).
    let rest = text.match_indices(&pattern).find_map(|(at, _)| {
        text[at + pattern.len()..]
            .trim_start()
            .strip_prefix(':')
            .map(str::trim_start)
    })?;
    let mut chars = rest.strip_prefix('"')?.chars();
    let mut out = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('b') => out.push('\u{8}'),
                Some('f') => out.push('\u{c}'),
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                        Some(ch) if hex.len() == 4 => out.push(ch),
                        _ => return Some(out),
                    }
                }
                Some(other) => out.push(other),
                None => return Some(out),
            },
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_oversize_line_is_salvaged_from_its_head() {
        let text = "é\"x".repeat(100);
        // As agents write it: the type first (a head without the type cannot be salvaged).
        let line = format!(
            r#"{{"type":"message","text":{}}}"#,
            serde_json::to_string(&text).expect("json")
        );
        // Cut inside a character, as the splitter may: it decodes the head lossily.
        let head = String::from_utf8_lossy(&line.as_bytes()[..150]).into_owned();
        match salvage(&head, line.len()) {
            Some(AgentLine::Message { text: got }) => {
                let kept = got.split(" … [cut").next().unwrap_or("");
                let kept = kept.trim_end_matches('\u{fffd}');
                assert!(kept.len() > 80 && text.starts_with(kept), "{got}");
                assert!(got.ends_with(&format!("[cut: the line was {} bytes]", line.len())));
            }
            other => panic!("{other:?}"),
        }
        let err = format!(
            r#"{{"type":"result","status":"error","error":"{}"}}"#,
            "boom ".repeat(50)
        );
        match salvage(&err[..80], 999_999) {
            Some(AgentLine::Result { status, error }) => {
                assert_eq!(status, AgentStatus::Error);
                assert!(error.is_some_and(|e| e.starts_with("boom boom")));
            }
            other => panic!("{other:?}"),
        }
        // The status itself cut off: still an error, never a silent turn.
        assert!(matches!(
            salvage(r#"{"type":"result","sta"#, 5_000_000),
            Some(AgentLine::Result {
                status: AgentStatus::Error,
                ..
            })
        ));
        assert_eq!(salvage(r#"{"text":"no type here"#, 10), None);
        assert_eq!(salvage(r#"{"type":"teleport"}"#, 10), None);
    }

    #[test]
    fn splits_across_chunks() {
        let mut s = LineSplitter::new(10);
        assert_eq!(s.push(b"ab"), vec![]);
        assert_eq!(
            s.push(b"c\nde\r\n\nf"),
            vec![
                Line::Text("abc".into()),
                Line::Text("de".into()),
                Line::Text("".into())
            ]
        );
        assert_eq!(s.finish(), Some(Line::Text("f".into())));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn oversize_lines_are_reported_with_their_head() {
        let mut s = LineSplitter::new(4);
        assert_eq!(s.push(b"12345"), vec![]);
        assert_eq!(
            s.push(b"678\nok\n"),
            vec![
                Line::Oversize {
                    len: 8,
                    head: "1234".into()
                },
                Line::Text("ok".into())
            ]
        );
        assert_eq!(
            s.push(b"123456\n"),
            vec![Line::Oversize {
                len: 6,
                head: "1234".into()
            }]
        );
        assert_eq!(s.push(b"\xff\xfe\n"), vec![Line::NotUtf8 { len: 2 }]);
    }

    proptest! {
        /// However the output is chunked, the same lines come out.
        #[test]
        fn chunking_does_not_matter(
            lines in prop::collection::vec("[a-z]{0,12}", 0..20),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let bytes = text.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut s = LineSplitter::new(8);
            let mut got = Vec::new();
            let mut last = 0;
            for p in points.into_iter().chain(std::iter::once(bytes.len())) {
                got.extend(s.push(&bytes[last..p]));
                last = p;
            }
            got.extend(s.finish());
            let want: Vec<Line> = lines.iter().map(|l| if l.len() > 8 {
                Line::Oversize { len: l.len(), head: l[..8].to_owned() }
            } else {
                Line::Text(l.clone())
            }).collect();
            prop_assert_eq!(got, want);
        }

        /// Issue 33: whatever bytes an agent prints, in whatever chunks, the splitter holds at
        /// most its bound, every line it gives is within it (an oversize one only its head),
        /// and what salvages an oversize line never panics.
        #[test]
        fn any_output_is_split_within_the_bound(
            chunks in prop::collection::vec(
                prop::collection::vec(
                    prop_oneof![Just(b'\n'), Just(b'"'), Just(b'{'), Just(0xffu8), any::<u8>()],
                    0..300,
                ),
                0..30,
            ),
            max in 1usize..64,
        ) {
            let mut s = LineSplitter::new(max);
            let mut lines = Vec::new();
            for c in &chunks {
                lines.extend(s.push(c));
                prop_assert!(s.buf.len() <= max, "buffered {} > {max}", s.buf.len());
                if let Some((_, head)) = &s.discarding {
                    prop_assert!(head.len() <= max.min(OVERSIZE_HEAD));
                }
            }
            lines.extend(s.finish());
            for l in lines {
                match l {
                    Line::Text(t) => prop_assert!(t.len() <= max),
                    Line::NotUtf8 { len } => prop_assert!(len <= max),
                    Line::Oversize { len, head } => {
                        prop_assert!(len > max);
                        // Lossily decoded: each byte at most three.
                        prop_assert!(head.len() <= 3 * max.min(OVERSIZE_HEAD));
                        let _ = salvage(&head, len);
                    }
                }
            }
        }

        /// The salvage of any head, of any claimed length: a line or nothing, never a panic.
        #[test]
        fn salvaging_any_head_never_panics(head in ".{0,200}", len in any::<usize>()) {
            let _ = salvage(&head, len);
            let _ = salvage(&format!(r#"{{"type":"message","text":"{head}"#), len);
            let _ = salvage(&format!(r#"{{"type":"result","status":"error","error":"{head}"#), len);
        }
    }
}
