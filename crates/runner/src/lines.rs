//! Splitting an agent's output into lines, with a bound: sans-IO, fed with whatever chunks the
//! backend delivers (Docker log frames, pipe reads). A line longer than the bound is reported as
//! oversize (with its length) and skipped, without ever holding more than the bound in memory.

/// The longest line the agent protocol accepts.
pub const MAX_LINE: usize = 1 << 20;

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// Not UTF-8; the bytes are dropped.
    NotUtf8 {
        len: usize,
    },
    Oversize {
        len: usize,
    },
}

#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    /// Inside an oversize line: bytes seen so far; nothing buffered.
    discarding: Option<usize>,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            buf: Vec::new(),
            discarding: None,
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
            if let Some(seen) = self.discarding.as_mut() {
                *seen += part.len();
                if complete {
                    out.push(Line::Oversize { len: *seen });
                    self.discarding = None;
                }
                continue;
            }
            if self.buf.len() + part.len() > self.max {
                self.discarding = Some(self.buf.len() + part.len());
                self.buf.clear();
                if complete {
                    out.push(Line::Oversize {
                        len: self.discarding.take().unwrap_or(0),
                    });
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
        if let Some(len) = self.discarding.take() {
            return Some(Line::Oversize { len });
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn oversize_lines_are_skipped_and_reported() {
        let mut s = LineSplitter::new(4);
        assert_eq!(s.push(b"12345"), vec![]);
        assert_eq!(
            s.push(b"678\nok\n"),
            vec![Line::Oversize { len: 8 }, Line::Text("ok".into())]
        );
        assert_eq!(s.push(b"123456\n"), vec![Line::Oversize { len: 6 }]);
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
                Line::Oversize { len: l.len() }
            } else {
                Line::Text(l.clone())
            }).collect();
            prop_assert_eq!(got, want);
        }
    }
}
