//! A message body on an HTTP/1.1 wire, in the framing its head announced: the one writer of the server's answers
//! (`direct.rs`) and of the proxy's requests, which the proxy takes from here (the server names no other module).

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::Frame;

/// How a body goes on the wire, as its head announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (an empty one, or a status that has none), or a body whose end is written.
    Nothing,
    /// This many bytes are left to write (`Content-Length`).
    Length(u64),
    /// In chunks, ended by the last chunk (and any trailers).
    Chunked,
    /// Until the connection closes (an HTTP/1.0 answer of unknown length).
    UntilClose,
}

/// A body that gave more or fewer bytes than its `Content-Length`: a surplus would reach the peer as the start of
/// the next message, and a peer short of bytes would wait for the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LengthMismatch;

/// Where a frame [`staged`](Framing::stage) went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Staged {
    /// Into the buffer, framed; or nowhere (an empty frame, trailers outside chunked framing).
    Gathered,
    /// Too large to copy: to be written from its own bytes after the buffer (which holds its chunk's size line),
    /// then `\r\n` when `chunk_end`.
    Piece { data: Bytes, chunk_end: bool },
    /// Trailers: the last chunk and its fields are in the buffer, and the body is ended (a byte more is refused).
    Ended,
}

impl Framing {
    /// Puts `frame` in line after what `out` holds: its data, framed, copied into `out` when it is at most
    /// `copy_limit` bytes, else handed back as a piece to write from its own bytes (no copy of a large body).
    // Inlined into each writer's loop: an answer's one frame is on every proxied request's path.
    #[inline]
    pub(crate) fn stage(
        &mut self,
        frame: Frame<Bytes>,
        out: &mut Vec<u8>,
        copy_limit: usize,
    ) -> Result<Staged, LengthMismatch> {
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Trailers travel only in chunked framing, and end it.
                if let (Self::Chunked, Ok(trailers)) = (*self, frame.into_trailers()) {
                    out.extend_from_slice(b"0\r\n");
                    for (name, value) in &trailers {
                        push_field(out, name, value);
                    }
                    out.extend_from_slice(b"\r\n");
                    // Nothing may follow the last chunk: a body that goes on breaks its framing.
                    *self = Self::Length(0);
                    return Ok(Staged::Ended);
                }
                return Ok(Staged::Gathered);
            }
        };
        if data.is_empty() {
            return Ok(Staged::Gathered);
        }
        match self {
            Self::Length(left) => {
                *left = left.checked_sub(data.len() as u64).ok_or(LengthMismatch)?;
            }
            Self::Chunked => {
                push_hex(out, data.len());
                out.extend_from_slice(b"\r\n");
            }
            Self::UntilClose | Self::Nothing => {}
        }
        let chunk_end = *self == Self::Chunked;
        if data.len() > copy_limit {
            return Ok(Staged::Piece { data, chunk_end });
        }
        out.extend_from_slice(&data);
        if chunk_end {
            out.extend_from_slice(b"\r\n");
        }
        Ok(Staged::Gathered)
    }

    /// Ends a body that is done: writes its last chunk when chunked; fails when it gave fewer bytes than its length.
    #[inline]
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), LengthMismatch> {
        match std::mem::replace(self, Self::Nothing) {
            Self::Chunked => {
                out.extend_from_slice(b"0\r\n\r\n");
                Ok(())
            }
            Self::Length(0) | Self::UntilClose | Self::Nothing => Ok(()),
            Self::Length(_) => Err(LengthMismatch),
        }
    }
}

/// Writes one field line, `name: value` and CRLF.
pub(crate) fn push_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes `value` in lowercase hexadecimal, as a chunk's size.
fn push_hex(out: &mut Vec<u8>, mut value: usize) {
    let mut digits = [0u8; 16];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b"0123456789abcdef"[value & 15];
        value >>= 4;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn data(bytes: &'static [u8]) -> Frame<Bytes> {
        Frame::data(Bytes::from_static(bytes))
    }

    #[test]
    fn chunks_are_sized_in_hex_and_large_ones_are_handed_back() {
        let mut out = Vec::new();
        let mut framing = Framing::Chunked;
        assert_eq!(
            framing.stage(data(b"ab"), &mut out, 8),
            Ok(Staged::Gathered)
        );
        assert_eq!(framing.stage(data(b""), &mut out, 8), Ok(Staged::Gathered));
        let large = [b'x'; 255];
        let staged = framing.stage(Frame::data(Bytes::copy_from_slice(&large)), &mut out, 8);
        assert_eq!(
            staged,
            Ok(Staged::Piece {
                data: Bytes::copy_from_slice(&large),
                chunk_end: true
            })
        );
        assert_eq!(out, b"2\r\nab\r\nff\r\n");
        out.clear();
        let mut sizes = Vec::new();
        for size in [0, 255, 0x1_0000] {
            sizes.clear();
            push_hex(&mut sizes, size);
            out.extend_from_slice(&sizes);
            out.push(b' ');
        }
        assert_eq!(out, b"0 ff 10000 ");
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("7"));
        out.clear();
        assert_eq!(
            framing.stage(Frame::trailers(trailers), &mut out, 8),
            Ok(Staged::Ended)
        );
        assert_eq!(out, b"0\r\nx-sum: 7\r\n\r\n");
        // Ended: a byte more is refused, and nothing more is written.
        assert_eq!(
            framing.clone().stage(data(b"x"), &mut Vec::new(), 8),
            Err(LengthMismatch)
        );
        assert_eq!(framing.finish(&mut out), Ok(()));
        assert_eq!(out, b"0\r\nx-sum: 7\r\n\r\n");
    }

    #[test]
    fn a_length_is_kept_to_both_ways() {
        let mut out = Vec::new();
        let mut framing = Framing::Length(3);
        assert_eq!(
            framing.stage(data(b"ab"), &mut out, 8),
            Ok(Staged::Gathered)
        );
        assert_eq!(framing.stage(data(b"cd"), &mut out, 8), Err(LengthMismatch));
        let mut short = Framing::Length(3);
        assert_eq!(short.stage(data(b"ab"), &mut out, 8), Ok(Staged::Gathered));
        assert_eq!(short.finish(&mut out), Err(LengthMismatch));
        let mut exact = Framing::Length(2);
        assert_eq!(exact.stage(data(b"ab"), &mut out, 8), Ok(Staged::Gathered));
        assert_eq!(exact.finish(&mut out), Ok(()));
        // Trailers outside chunked framing are dropped.
        let mut plain = Framing::UntilClose;
        assert_eq!(
            plain.stage(Frame::trailers(HeaderMap::new()), &mut out, 8),
            Ok(Staged::Gathered)
        );
        assert_eq!(out, b"ababab");
    }
}
