//! A response body that passes its frames through untouched while a [`UsageReader`] reads them, and hands what it
//! read to a [`UsageSink`] exactly once: when the body ends, fails or is dropped. Dropped before the usage is known
//! (the client went away), it hands over the rest of the answer unread, for the usage to be read on ([`Unread`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use parking_lot::Mutex;

use super::reader::UsageReader;
use super::reported::Usage;

/// How the body whose usage was read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Its last frame was taken (or its usage was whole before: a header): the usage is all the answer reported
    /// (a stream's last event included even without its blank line).
    Complete,
    /// It yielded an error: the usage is what the frames before it reported.
    Failed,
    /// Dropped before its end (the client went away), or read on past a bound: the usage is what was read so far.
    Cut,
}

/// Where a [`UsageBody`] hands what it read, once.
pub trait UsageSink: Send + 'static {
    /// The answer's usage as read when its body ended as `end` says.
    fn read(self, usage: Usage, end: BodyEnd);

    /// The body was dropped before its end with more usage to learn: `rest` is the answer not read yet. By default
    /// the usage read so far, cut.
    fn cut(self, rest: Unread)
    where
        Self: Sized,
    {
        let usage = rest.usage();
        self.read(usage, BodyEnd::Cut);
    }
}

impl<F: FnOnce(Usage, BodyEnd) + Send + 'static> UsageSink for F {
    fn read(self, usage: Usage, end: BodyEnd) {
        self(usage, end)
    }
}

/// The rest of an answer its client left before its usage was known, with the reader that read its start.
pub struct Unread {
    body: Body,
    reader: UsageReader,
}

/// What a body handed to a [`SharedUsage`].
#[derive(Debug)]
pub enum Handed {
    /// The usage, as the body ended.
    Read(Usage, BodyEnd),
    /// The body was dropped before its end with its usage still to come.
    Cut(Box<Unread>),
}

/// A [`UsageSink`] that keeps the reading for whoever holds a clone: the work that runs after the answer takes it
/// from there. The body hands its reading over before it is dropped, so work that runs when the body is dropped
/// after it finds the reading there.
#[derive(Debug, Clone, Default)]
pub struct SharedUsage(Arc<Mutex<Option<Handed>>>);

/// `inner`, its frames read by a [`UsageReader`] on their way through.
pub struct UsageBody<S: UsageSink> {
    inner: Body,
    reader: UsageReader,
    sink: Option<S>,
}

// === impl Unread ===

impl Unread {
    /// The usage read before the client left.
    pub fn usage(&self) -> Usage {
        self.reader.usage()
    }

    /// Reads the rest of the answer (discarded) for its usage: at most `max_bytes` more, for at most `timeout`.
    /// Past either, or on an error, what was read by then, [`BodyEnd::Cut`] or [`BodyEnd::Failed`].
    pub async fn read_on(mut self, max_bytes: u64, timeout: Duration) -> (Usage, BodyEnd) {
        let end = {
            let reading = async {
                let mut read: u64 = 0;
                while let Some(frame) = self.body.frame().await {
                    let Ok(frame) = frame else {
                        return BodyEnd::Failed;
                    };
                    if let Some(data) = frame.data_ref() {
                        read = read.saturating_add(data.len() as u64);
                        if read > max_bytes {
                            return BodyEnd::Cut;
                        }
                        self.reader.feed(data);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        self.reader.trailers(trailers);
                    }
                }
                self.reader.finish();
                BodyEnd::Complete
            };
            tokio::time::timeout(timeout, reading)
                .await
                .unwrap_or(BodyEnd::Cut)
        };
        (self.reader.usage(), end)
    }
}

impl std::fmt::Debug for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unread")
            .field("reader", &self.reader)
            .finish_non_exhaustive()
    }
}

// === impl SharedUsage ===

impl SharedUsage {
    /// What the body handed over, once it did.
    pub fn take(&self) -> Option<Handed> {
        self.0.lock().take()
    }
}

impl UsageSink for SharedUsage {
    fn read(self, usage: Usage, end: BodyEnd) {
        *self.0.lock() = Some(Handed::Read(usage, end));
    }

    fn cut(self, rest: Unread) {
        *self.0.lock() = Some(Handed::Cut(Box::new(rest)));
    }
}

// === impl UsageBody ===

impl<S: UsageSink> UsageBody<S> {
    /// `inner` read by `reader` (made from the answer's head), handing the reading to `sink` when it ends.
    pub fn new(inner: Body, reader: UsageReader, sink: S) -> Self {
        let mut body = Self {
            inner,
            reader,
            sink: Some(sink),
        };
        // A body known empty may be dropped unpolled (HEAD, 204, 304): it is whole already.
        if body.inner.is_end_stream() {
            body.end(BodyEnd::Complete);
        }
        body
    }

    fn end(&mut self, end: BodyEnd) {
        if let Some(sink) = self.sink.take() {
            if end == BodyEnd::Complete {
                self.reader.finish();
            }
            sink.read(self.reader.usage(), end);
        }
    }
}

impl<S: UsageSink> std::fmt::Debug for UsageBody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageBody")
            .field("reader", &self.reader)
            .field("ended", &self.sink.is_none())
            .finish()
    }
}

impl<S: UsageSink + Unpin> HttpBody for UsageBody<S> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                // A server stops polling a body after its trailers, or after a frame once the body says it has
                // ended (hyper's HTTP/1 server does both): either was its last frame.
                let last = if let Some(data) = frame.data_ref() {
                    this.reader.feed(data);
                    this.inner.is_end_stream()
                } else if let Some(trailers) = frame.trailers_ref() {
                    this.reader.trailers(trailers);
                    true
                } else {
                    this.inner.is_end_stream()
                };
                if last {
                    this.end(BodyEnd::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => this.end(BodyEnd::Failed),
            Poll::Ready(None) => this.end(BodyEnd::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<S: UsageSink> Drop for UsageBody<S> {
    fn drop(&mut self) {
        let Some(sink) = self.sink.take() else {
            return;
        };
        if self.reader.is_whole() {
            // The usage came whole before the body (a header): leaving early changes nothing.
            sink.read(self.reader.usage(), BodyEnd::Complete);
        } else if self.reader.may_learn_more() && !self.inner.is_end_stream() {
            let reader = std::mem::replace(&mut self.reader, UsageReader::unreadable());
            sink.cut(Unread {
                body: std::mem::take(&mut self.inner),
                reader,
            });
        } else {
            sink.read(self.reader.usage(), BodyEnd::Cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::stream;
    use http::{HeaderMap, HeaderValue};
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;
    use crate::usage::reader::UsageFormat;

    type Frames = Vec<Result<Frame<Bytes>, &'static str>>;
    type FramesBody =
        StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>>;

    /// What the body handed over, the rest of a cut one unread.
    fn read(shared: &SharedUsage) -> Option<(Usage, BodyEnd)> {
        shared.take().map(|handed| match handed {
            Handed::Read(usage, end) => (usage, end),
            Handed::Cut(rest) => (rest.usage(), BodyEnd::Cut),
        })
    }

    fn sse_reader() -> UsageReader {
        let mut head = HeaderMap::new();
        head.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        UsageReader::new(&UsageFormat::OpenAi, &head)
    }

    fn body(frames: Frames) -> FramesBody {
        StreamBody::new(stream::iter(frames))
    }

    fn data(text: &'static str) -> Result<Frame<Bytes>, &'static str> {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    const EVENTS: [&str; 4] = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"us",
        "age\":{\"prompt_tokens\":4,\"completion_",
        "tokens\":6,\"total_tokens\":10}}\r",
        "\n\r\ndata: [DONE]",
    ];

    fn expected() -> Usage {
        Usage {
            input_tokens: Some(4),
            output_tokens: Some(6),
            total_tokens: Some(10),
        }
    }

    #[tokio::test]
    async fn frames_pass_through_untouched_and_the_usage_is_handed_over_at_the_end() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        let mut frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        frames.push(Ok(Frame::trailers(trailers.clone())));
        let shared = SharedUsage::default();
        let usage_body = UsageBody::new(Body::new(body(frames)), sse_reader(), shared.clone());
        let collected = usage_body.collect().await.expect("no error");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), EVENTS.concat().as_bytes());
        assert_eq!(read(&shared), Some((expected(), BodyEnd::Complete)));
        assert_eq!(read(&shared), None, "handed over once");
    }

    #[tokio::test]
    async fn a_body_cut_mid_stream_hands_over_what_was_read() {
        let shared = SharedUsage::default();
        let frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        let mut usage_body = UsageBody::new(Body::new(body(frames)), sse_reader(), shared.clone());
        for _ in 0..2 {
            usage_body.frame().await.expect("a frame").expect("data");
        }
        assert_eq!(read(&shared), None);
        drop(usage_body);
        assert_eq!(read(&shared), Some((Usage::MISSING, BodyEnd::Cut)));

        let mut usage_body = UsageBody::new(
            Body::new(body(EVENTS.iter().map(|piece| data(piece)).collect())),
            sse_reader(),
            shared.clone(),
        );
        for _ in 0..4 {
            usage_body.frame().await.expect("a frame").expect("data");
        }
        drop(usage_body);
        assert_eq!(read(&shared), Some((expected(), BodyEnd::Cut)));
    }

    #[tokio::test]
    async fn a_failing_body_hands_over_what_came_before_the_error() {
        let shared = SharedUsage::default();
        let mut frames: Frames = EVENTS[..3].iter().map(|piece| data(piece)).collect();
        frames.push(data("\n\n"));
        frames.push(Err("upstream reset"));
        let usage_body = UsageBody::new(Body::new(body(frames)), sse_reader(), shared.clone());
        assert!(usage_body.collect().await.is_err());
        assert_eq!(read(&shared), Some((expected(), BodyEnd::Failed)));
    }

    #[tokio::test]
    async fn a_body_that_says_it_ended_completes_with_its_last_frame() {
        // Full says it has ended once its one frame is taken; a server polls it no further.
        let handed = Arc::new(Mutex::new(None));
        let sink = {
            let handed = handed.clone();
            move |usage: Usage, end: BodyEnd| *handed.lock() = Some((usage, end))
        };
        let json = Full::new(Bytes::from_static(
            b"{\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}",
        ));
        let mut usage_body = UsageBody::new(
            Body::new(json),
            UsageReader::new(&UsageFormat::OpenAi, &HeaderMap::new()),
            sink,
        );
        usage_body.frame().await.expect("a frame").expect("data");
        assert!(usage_body.is_end_stream());
        let read = handed.lock().take();
        assert_eq!(
            read,
            Some((
                Usage {
                    input_tokens: Some(2),
                    output_tokens: Some(3),
                    total_tokens: Some(5)
                },
                BodyEnd::Complete
            ))
        );
        drop(usage_body);
        assert_eq!(
            handed.lock().take(),
            None,
            "dropping after the end hands nothing more"
        );
    }

    /// `body` served by hyper's HTTP/1 server to a hyper client that reads the whole answer; the reading handed over.
    async fn served<B>(body: B, shared: &SharedUsage) -> Option<(Usage, BodyEnd)>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let body = std::sync::Mutex::new(Some(UsageBody::new(
            Body::new(body),
            sse_reader(),
            shared.clone(),
        )));
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let service = hyper::service::service_fn(move |_request| {
                let body = body.lock().expect("lock").take().expect("one request");
                async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let request = http::Request::get("/")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        response.into_body().collect().await.expect("whole body");
        // The server's connection task is done with the body once the client has it all; it ends when the client
        // hangs up.
        drop(sender);
        let _ = server.await;
        read(shared)
    }

    #[tokio::test]
    async fn served_by_hyper_a_body_with_a_known_length_or_trailers_ends_complete() {
        // hyper stops polling a body after a data frame once it says it has ended, and after trailers: neither
        // answer's end is ever a `None` from the body, and both are whole.
        let shared = SharedUsage::default();
        let whole = served(Full::new(Bytes::from(EVENTS.concat())), &shared).await;
        assert_eq!(whole, Some((expected(), BodyEnd::Complete)));
        let mut frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-done", HeaderValue::from_static("1"));
        frames.push(Ok(Frame::trailers(trailers)));
        let with_trailers = served(body(frames), &shared).await;
        assert_eq!(with_trailers, Some((expected(), BodyEnd::Complete)));
    }

    #[tokio::test]
    async fn an_empty_body_is_complete_before_it_is_polled() {
        let shared = SharedUsage::default();
        let mut head = HeaderMap::new();
        head.insert("x-tokens", HeaderValue::from_static("7"));
        let reader = UsageReader::new(
            &UsageFormat::Header(http::HeaderName::from_static("x-tokens")),
            &head,
        );
        let usage_body = UsageBody::new(Body::new(Full::new(Bytes::new())), reader, shared.clone());
        drop(usage_body);
        assert_eq!(read(&shared), Some((Usage::total(7), BodyEnd::Complete)));
    }
}
