//! An answer's body taken out of the connection's read buffer: by its `Content-Length`, by chunks, or up to the
//! close.

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;

use super::WireError;

/// The longest chunk-size line (with its extensions) and the most trailer bytes read: past them the answer is
/// malformed.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

/// Where the body's reading is.
#[derive(Debug)]
pub(in crate::proxy::pool) struct Decoder {
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// This many bytes left.
    Length(u64),
    /// Before a chunk's size line.
    ChunkSize,
    /// Inside a chunk: this many bytes left, then its CRLF.
    ChunkData(u64),
    /// After a chunk's data.
    ChunkEnd,
    /// After the last chunk: trailer fields, then the empty line.
    Trailers,
    /// Everything until the target closes the connection.
    UntilClose,
    /// The body has ended.
    Done,
}

/// What the buffer gave.
pub(in crate::proxy::pool) enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

impl Decoder {
    pub(in crate::proxy::pool) fn empty() -> Self {
        Self { state: State::Done }
    }

    pub(in crate::proxy::pool) fn length(length: u64) -> Self {
        let state = if length == 0 {
            State::Done
        } else {
            State::Length(length)
        };
        Self { state }
    }

    pub(in crate::proxy::pool) fn chunked() -> Self {
        Self {
            state: State::ChunkSize,
        }
    }

    pub(in crate::proxy::pool) fn until_close() -> Self {
        Self {
            state: State::UntilClose,
        }
    }

    pub(in crate::proxy::pool) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    pub(in crate::proxy::pool) fn reads_until_close(&self) -> bool {
        matches!(self.state, State::UntilClose)
    }

    /// The bytes left when the length is known.
    pub(in crate::proxy::pool) fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(left) => Some(left),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The next part of the body that `buffer` holds, taken out of it.
    pub(in crate::proxy::pool) fn decode(
        &mut self,
        buffer: &mut BytesMut,
    ) -> Result<Step, WireError> {
        loop {
            match self.state {
                State::Done => return Ok(Step::End),
                State::Length(left) | State::ChunkData(left) => {
                    if buffer.is_empty() {
                        return Ok(Step::More);
                    }
                    let take = buffer
                        .len()
                        .min(usize::try_from(left).unwrap_or(usize::MAX));
                    let left = left - take as u64;
                    self.state = match (self.state, left) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), _) => State::Length(left),
                        (_, 0) => State::ChunkEnd,
                        (_, _) => State::ChunkData(left),
                    };
                    return Ok(Step::Data(buffer.split_to(take).freeze()));
                }
                State::UntilClose => {
                    if buffer.is_empty() {
                        return Ok(Step::More);
                    }
                    return Ok(Step::Data(buffer.split().freeze()));
                }
                State::ChunkSize => {
                    let Some(line) = line_end(buffer, MAX_CHUNK_LINE)? else {
                        return Ok(Step::More);
                    };
                    let size = chunk_size(&buffer[..line])?;
                    buffer.advance(line + 1);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkEnd => {
                    let Some(line) = line_end(buffer, 2)? else {
                        return Ok(Step::More);
                    };
                    if !buffer[..line].iter().all(|&byte| byte == b'\r') || line > 1 {
                        return Err(WireError::Malformed("chunk data longer than its size"));
                    }
                    buffer.advance(line + 1);
                    self.state = State::ChunkSize;
                }
                State::Trailers => return self.trailers(buffer),
            }
        }
    }

    /// What the connection's close means: the end of a body read until then, or an answer cut short.
    pub(in crate::proxy::pool) fn closed(&mut self) -> Result<Step, WireError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(Step::End)
            }
            _ => Err(WireError::Closed),
        }
    }

    /// The trailer section: fields (passed on as a trailers frame when there are any), then the empty line.
    fn trailers(&mut self, buffer: &mut BytesMut) -> Result<Step, WireError> {
        if buffer.starts_with(b"\r\n") || buffer.starts_with(b"\n") {
            buffer.advance(if buffer[0] == b'\r' { 2 } else { 1 });
            self.state = State::Done;
            return Ok(Step::End);
        }
        let mut fields = [httparse::EMPTY_HEADER; 32];
        match httparse::parse_headers(buffer, &mut fields)? {
            httparse::Status::Partial if buffer.len() > MAX_TRAILERS => {
                Err(WireError::HeadTooLarge(MAX_TRAILERS))
            }
            httparse::Status::Partial => Ok(Step::More),
            httparse::Status::Complete((length, fields)) => {
                let mut trailers = HeaderMap::with_capacity(fields.len());
                for field in fields {
                    let name = http::HeaderName::from_bytes(field.name.as_bytes())
                        .map_err(|_| WireError::Malformed("invalid trailer name"))?;
                    let value = http::HeaderValue::from_bytes(field.value)
                        .map_err(|_| WireError::Malformed("invalid trailer value"))?;
                    trailers.append(name, value);
                }
                buffer.advance(length);
                self.state = State::Done;
                Ok(Step::Trailers(trailers))
            }
        }
    }
}

/// The index of the `\n` ending the line at the start of `buffer`, if it is there; an error past `limit` bytes.
fn line_end(buffer: &[u8], limit: usize) -> Result<Option<usize>, WireError> {
    match buffer
        .iter()
        .take(limit + 1)
        .position(|&byte| byte == b'\n')
    {
        Some(end) => Ok(Some(end)),
        None if buffer.len() > limit => Err(WireError::Malformed("chunk line too long")),
        None => Ok(None),
    }
}

/// A chunk-size line's size (hex digits, then optional extensions after `;`, then CR).
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line
        .split(|&byte| byte == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(WireError::Malformed("invalid chunk size"));
    }
    let mut size = 0u64;
    for &digit in digits {
        let value = (digit as char)
            .to_digit(16)
            .ok_or(WireError::Malformed("invalid chunk size"))?;
        size = size * 16 + u64::from(value);
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the decoder gives for `wire` fed `step` bytes at a time: the data, the trailers, whether it ended.
    fn decode_in_steps(
        decoder: &mut Decoder,
        wire: &[u8],
        step: usize,
    ) -> (Vec<u8>, Option<HeaderMap>, bool) {
        let mut buffer = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        loop {
            match decoder.decode(&mut buffer).expect("well formed") {
                Step::Data(bytes) => data.extend_from_slice(&bytes),
                Step::Trailers(fields) => trailers = Some(fields),
                Step::End => return (data, trailers, true),
                Step::More if fed == wire.len() => return (data, trailers, false),
                Step::More => {
                    let next = (fed + step).min(wire.len());
                    buffer.extend_from_slice(&wire[fed..next]);
                    fed = next;
                }
            }
        }
    }

    #[test]
    fn chunks_are_decoded_however_the_bytes_arrive() {
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n";
        for step in 1..wire.len() {
            let (data, trailers, ended) = decode_in_steps(&mut Decoder::chunked(), wire, step);
            assert_eq!(data, b"hello world", "step {step}");
            assert_eq!(trailers.expect("trailers")["x-sum"], "11");
            assert!(ended);
        }
        let (data, trailers, ended) =
            decode_in_steps(&mut Decoder::chunked(), b"3\r\nabc\r\n0\r\n\r\n", 4);
        assert_eq!(
            (data.as_slice(), trailers.is_none(), ended),
            (&b"abc"[..], true, true)
        );
    }

    #[test]
    fn a_length_takes_no_byte_past_it() {
        let mut buffer = BytesMut::from(&b"abcdeNEXT"[..]);
        let mut decoder = Decoder::length(5);
        assert!(matches!(decoder.decode(&mut buffer), Ok(Step::Data(data)) if data == "abcde"));
        assert!(matches!(decoder.decode(&mut buffer), Ok(Step::End)));
        assert_eq!(&buffer[..], b"NEXT");
        assert!(matches!(
            Decoder::length(5).closed(),
            Err(WireError::Closed)
        ));
        assert!(matches!(Decoder::until_close().closed(), Ok(Step::End)));
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for wire in [&b"zz\r\n"[..], b"3\r\nabcd\r\n", b"12345678901234567\r\n"] {
            let mut buffer = BytesMut::from(wire);
            let mut decoder = Decoder::chunked();
            let result = (0..4).try_for_each(|_| decoder.decode(&mut buffer).map(|_| ()));
            assert!(result.is_err(), "{:?}", String::from_utf8_lossy(wire));
        }
    }
}
