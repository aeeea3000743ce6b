//! Writing a request to the target: its head, then its body in the framing the head announced; a small body goes
//! in the head's write.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::body::Body;
use bytes::{Buf, Bytes};
use http_body::{Body as _, Frame};
use tokio::io::AsyncWrite;

use crate::server::body_framing::{Framing, Staged};

/// Body bytes gathered into the write of what comes before them (the head, a chunk's size line) while it stays
/// under this size: a small request goes out in one write, a large chunk is written from its own bytes.
const GATHER: usize = 16 * 1024;

/// Why the request could not be written.
pub(in crate::proxy::pool) enum UploadError {
    /// The client's body failed.
    Body(axum::Error),
    /// The connection failed.
    Io(std::io::Error),
}

/// A request being written: the bytes of `out` (the head, chunk framing, small body parts), then `data`.
pub(in crate::proxy::pool) struct Upload {
    framing: Framing,
    /// How much of `out` is written.
    written: usize,
    /// A body part too large to gather, written from its own bytes.
    data: Bytes,
    /// Whether `data` is a chunk, whose CRLF follows it.
    chunk_open: bool,
    body_done: bool,
    finished: bool,
    /// Whether any byte went out or any part of the body was taken: the request can no longer go elsewhere whole.
    pub(in crate::proxy::pool) committed: bool,
}

impl Upload {
    pub(in crate::proxy::pool) fn new(framing: Framing) -> Self {
        Self {
            framing,
            written: 0,
            data: Bytes::new(),
            chunk_open: false,
            body_done: framing == Framing::Nothing,
            finished: false,
            committed: false,
        }
    }

    /// Whether the whole request has been written and flushed.
    pub(in crate::proxy::pool) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Writes what can be written of `out` and `body`; ready once all of it is written and flushed.
    pub(in crate::proxy::pool) fn poll<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        out: &mut Vec<u8>,
        body: &mut Body,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        loop {
            if !self.body_done && self.data.is_empty() && out.len() - self.written < GATHER {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        self.committed = true;
                        if let Err(error) = self.stage(frame, out) {
                            return Poll::Ready(Err(error));
                        }
                        // Another may be gathered with it (and an empty one left nothing to write).
                        continue;
                    }
                    Poll::Ready(Some(Err(error))) => {
                        return Poll::Ready(Err(UploadError::Body(error)))
                    }
                    Poll::Ready(None) => {
                        self.body_done = true;
                        // Short of its length, the target would wait for the rest, and read the next request as it.
                        if self.framing.finish(out).is_err() {
                            return Poll::Ready(Err(mismatch()));
                        }
                    }
                    Poll::Pending => {}
                }
            }
            if self.written < out.len() {
                let wrote = ready!(Pin::new(&mut *io).poll_write(cx, &out[self.written..]))
                    .map_err(UploadError::Io)?;
                if wrote == 0 {
                    return Poll::Ready(Err(UploadError::Io(std::io::ErrorKind::WriteZero.into())));
                }
                self.committed = true;
                self.written += wrote;
                if self.written == out.len() {
                    out.clear();
                    self.written = 0;
                }
                continue;
            }
            if !self.data.is_empty() {
                let wrote = ready!(Pin::new(&mut *io).poll_write(cx, &self.data))
                    .map_err(UploadError::Io)?;
                if wrote == 0 {
                    return Poll::Ready(Err(UploadError::Io(std::io::ErrorKind::WriteZero.into())));
                }
                self.data.advance(wrote);
                if self.data.is_empty() && std::mem::take(&mut self.chunk_open) {
                    out.extend_from_slice(b"\r\n");
                }
                continue;
            }
            if !self.body_done {
                // Nothing to write, and the body has nothing yet: its poll registered the wake-up.
                return Poll::Pending;
            }
            ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(UploadError::Io)?;
            self.finished = true;
            return Poll::Ready(Ok(()));
        }
    }

    /// Puts a body frame in line: gathered into `out` while that stays under [`GATHER`], else kept in `data`. A
    /// body longer than its `Content-Length` is refused: its surplus would reach the target as the start of another
    /// request.
    fn stage(&mut self, frame: Frame<Bytes>, out: &mut Vec<u8>) -> Result<(), UploadError> {
        let room = GATHER.saturating_sub(out.len() - self.written);
        match self.framing.stage(frame, out, room) {
            Err(_) => return Err(mismatch()),
            // The last chunk is written; the body is still read to its end.
            Ok(Staged::Gathered | Staged::Ended) => {}
            Ok(Staged::Piece { data, chunk_end }) => {
                self.data = data;
                self.chunk_open = chunk_end;
            }
        }
        Ok(())
    }
}

/// A body that is not as long as the head said.
fn mismatch() -> UploadError {
    UploadError::Io(std::io::Error::other(
        "request body not as long as its Content-Length",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything `upload` writes of `head` and `body`.
    async fn written(framing: Framing, body: Body) -> Vec<u8> {
        let mut upload = Upload::new(framing);
        let mut out = b"HEAD\r\n\r\n".to_vec();
        let mut body = body;
        let mut sink = Vec::new();
        std::future::poll_fn(|cx| upload.poll(&mut sink, &mut out, &mut body, cx))
            .await
            .unwrap_or_else(|_| panic!("written"));
        sink
    }

    #[tokio::test]
    async fn bodies_go_in_the_framing_the_head_announced() {
        let small = written(Framing::Length(3), Body::from("abc")).await;
        assert_eq!(small, b"HEAD\r\n\r\nabc");
        let large = vec![b'x'; GATHER + 1];
        let sent = written(
            Framing::Length(large.len() as u64),
            Body::from(large.clone()),
        )
        .await;
        assert_eq!(&sent[8..], &large[..]);
        let parts = [
            Ok::<_, std::io::Error>(Bytes::from("ab")),
            Ok(Bytes::new()),
            Ok(Bytes::from("cde")),
        ];
        let chunked = written(
            Framing::Chunked,
            Body::from_stream(futures_util::stream::iter(parts)),
        )
        .await;
        assert_eq!(chunked, b"HEAD\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n");
        let big = vec![b'y'; GATHER + 1];
        let one = [Ok::<_, std::io::Error>(Bytes::from(big.clone()))];
        let chunked = written(
            Framing::Chunked,
            Body::from_stream(futures_util::stream::iter(one)),
        )
        .await;
        let mut expected = format!("HEAD\r\n\r\n{:x}\r\n", big.len()).into_bytes();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(chunked, expected);
        // Trailers end a chunked body: the last chunk carries them, and nothing follows.
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", http::HeaderValue::from_static("7"));
        let frames = [
            Ok::<_, std::io::Error>(Frame::data(Bytes::from("ab"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )));
        let sent = written(Framing::Chunked, body).await;
        assert_eq!(sent, b"HEAD\r\n\r\n2\r\nab\r\n0\r\nx-sum: 7\r\n\r\n");
    }
}
