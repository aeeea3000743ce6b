//! The reading of an answer's usage as its [`GuardedBody`] passes, on a route with `usage:` (the `llm` feature).

use std::pin::Pin;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};

use super::{AnswerGuard, Ending, GuardedBody};
use crate::usage::{BodyEnd, Handed, UsageReader};

/// The reading of an answer's usage as its body passes.
pub(super) struct UsageRead<B> {
    reader: UsageReader,
    /// Takes the rest of the body, unless it has ended, for its usage to be read on after the client left.
    rest: fn(Pin<&mut B>) -> Option<Body>,
}

// === impl UsageRead ===

impl<B> UsageRead<B> {
    /// Reads what `frame` (of the body, on its way through) says.
    pub(super) fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.reader.feed(data);
        } else if let Some(trailers) = frame.trailers_ref() {
            self.reader.trailers(trailers);
        }
    }

    /// Hands `guard` what was read of a body that ended as `ending`.
    pub(super) fn ended(self, ending: Ending, guard: &mut AnswerGuard) {
        let end = match ending {
            Ending::Complete => BodyEnd::Complete,
            Ending::Failed => BodyEnd::Failed,
            Ending::Cut => BodyEnd::Cut,
        };
        guard.usage(Handed::ended(self.reader, end));
    }

    /// Hands `guard` what was read of a body dropped before its end, `inner` (with the rest of it to read on, when
    /// the usage may still come).
    pub(super) fn dropped(self, inner: Pin<&mut B>, guard: &mut AnswerGuard) {
        let UsageRead { reader, rest } = self;
        guard.usage(Handed::dropped(reader, || rest(inner)));
    }
}

// === impl GuardedBody ===

impl GuardedBody<Body> {
    /// `inner`, its usage read by `reader` (made from the answer's head) and handed to `guard`'s work as it ends,
    /// running `guard` when it ends.
    pub fn reading(inner: Body, reader: UsageReader, guard: AnswerGuard) -> Self {
        let mut body = Self::new(inner, guard);
        // A body known empty may be dropped unpolled (HEAD, 204, 304): its usage is whole already.
        if body.inner.is_end_stream() {
            body.guard.usage(Handed::ended(reader, BodyEnd::Complete));
        } else {
            body.usage = Some(Box::new(UsageRead {
                reader,
                rest: |body| (!body.is_end_stream()).then(|| std::mem::take(body.get_mut())),
            }));
        }
        body
    }
}

/// The answer's usage as [`GuardedBody`] reads it and hands it over, on a route with `usage:`.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::stream;
    use http::{HeaderMap, HeaderValue};
    use http_body_util::{BodyExt, Full, StreamBody};
    use parking_lot::Mutex;

    use super::super::AfterAnswer;
    use super::*;
    use crate::usage::{Usage, UsageFormat};

    type Frames = Vec<Result<Frame<Bytes>, &'static str>>;
    type FramesBody =
        StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>>;

    /// What the work was handed (the rest of a cut answer unread) and how the answer ended, in that order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Seen {
        Usage(Usage, BodyEnd),
        Ended(Ending),
    }

    #[derive(Clone, Default)]
    struct Seeing(Arc<Mutex<Vec<Seen>>>);

    impl AfterAnswer for Seeing {
        fn usage(&mut self, handed: Handed) {
            let (usage, end) = match handed {
                Handed::Read(usage, end) => (usage, end),
                Handed::Cut(rest) => (rest.usage(), BodyEnd::Cut),
            };
            self.0.lock().push(Seen::Usage(usage, end));
        }

        fn ended(self: Box<Self>, ending: Ending) {
            self.0.lock().push(Seen::Ended(ending));
        }
    }

    impl Seeing {
        fn take(&self) -> Vec<Seen> {
            std::mem::take(&mut *self.0.lock())
        }

        /// What was handed, once the answer ended.
        fn read(&self) -> Option<(Usage, BodyEnd)> {
            let seen = self.take();
            match seen.as_slice() {
                [] => None,
                [Seen::Usage(usage, end), Seen::Ended(_)] => Some((*usage, *end)),
                other => panic!("the usage once, then the ending: {other:?}"),
            }
        }
    }

    fn reading<B>(body: B, reader: UsageReader, seeing: &Seeing) -> GuardedBody<Body>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let guard = AnswerGuard::new(Box::new(seeing.clone()));
        GuardedBody::reading(Body::new(body), reader, guard)
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
    async fn frames_pass_through_untouched_and_the_usage_is_handed_over_before_the_end() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        let mut frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        frames.push(Ok(Frame::trailers(trailers.clone())));
        let seeing = Seeing::default();
        let collected = reading(body(frames), sse_reader(), &seeing)
            .collect()
            .await
            .expect("no error");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), EVENTS.concat().as_bytes());
        assert_eq!(
            seeing.take(),
            [
                Seen::Usage(expected(), BodyEnd::Complete),
                Seen::Ended(Ending::Complete)
            ]
        );
    }

    #[tokio::test]
    async fn a_body_cut_mid_stream_hands_over_what_was_read() {
        let seeing = Seeing::default();
        let frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        let mut cut = reading(body(frames), sse_reader(), &seeing);
        for _ in 0..2 {
            cut.frame().await.expect("a frame").expect("data");
        }
        assert_eq!(seeing.read(), None);
        drop(cut);
        assert_eq!(
            seeing.take(),
            [
                Seen::Usage(Usage::MISSING, BodyEnd::Cut),
                Seen::Ended(Ending::Cut)
            ]
        );

        let frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        let mut cut = reading(body(frames), sse_reader(), &seeing);
        for _ in 0..4 {
            cut.frame().await.expect("a frame").expect("data");
        }
        drop(cut);
        assert_eq!(seeing.read(), Some((expected(), BodyEnd::Cut)));
    }

    #[tokio::test]
    async fn a_failing_body_hands_over_what_came_before_the_error() {
        let seeing = Seeing::default();
        let mut frames: Frames = EVENTS[..3].iter().map(|piece| data(piece)).collect();
        frames.push(data("\n\n"));
        frames.push(Err("upstream reset"));
        assert!(reading(body(frames), sse_reader(), &seeing)
            .collect()
            .await
            .is_err());
        assert_eq!(
            seeing.take(),
            [
                Seen::Usage(expected(), BodyEnd::Failed),
                Seen::Ended(Ending::Failed)
            ]
        );
    }

    #[tokio::test]
    async fn a_body_that_says_it_ended_completes_with_its_last_frame() {
        // Full says it has ended once its one frame is taken; a server polls it no further.
        let seeing = Seeing::default();
        let json = Full::new(Bytes::from_static(
            b"{\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}",
        ));
        let reader = UsageReader::new(&UsageFormat::OpenAi, &HeaderMap::new());
        let mut whole = reading(json, reader, &seeing);
        whole.frame().await.expect("a frame").expect("data");
        assert!(whole.is_end_stream());
        let read = seeing.read();
        let usage = Usage {
            input_tokens: Some(2),
            output_tokens: Some(3),
            total_tokens: Some(5),
        };
        assert_eq!(read, Some((usage, BodyEnd::Complete)));
        drop(whole);
        assert_eq!(
            seeing.take(),
            [],
            "dropping after the end hands nothing more"
        );
    }

    /// `body` served by hyper's HTTP/1 server to a hyper client that reads the whole answer; what was handed over.
    async fn served<B>(body: B, seeing: &Seeing) -> Option<(Usage, BodyEnd)>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let body = std::sync::Mutex::new(Some(reading(body, sse_reader(), seeing)));
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
        seeing.read()
    }

    #[tokio::test]
    async fn served_by_hyper_a_body_with_a_known_length_or_trailers_ends_complete() {
        // hyper stops polling a body after a data frame once it says it has ended, and after trailers: neither
        // answer's end is ever a `None` from the body, and both are whole.
        let seeing = Seeing::default();
        let whole = served(Full::new(Bytes::from(EVENTS.concat())), &seeing).await;
        assert_eq!(whole, Some((expected(), BodyEnd::Complete)));
        let mut frames: Frames = EVENTS.iter().map(|piece| data(piece)).collect();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-done", HeaderValue::from_static("1"));
        frames.push(Ok(Frame::trailers(trailers)));
        let with_trailers = served(body(frames), &seeing).await;
        assert_eq!(with_trailers, Some((expected(), BodyEnd::Complete)));
    }

    #[tokio::test]
    async fn an_empty_body_is_complete_before_it_is_polled() {
        let seeing = Seeing::default();
        let mut head = HeaderMap::new();
        head.insert("x-tokens", HeaderValue::from_static("7"));
        let reader = UsageReader::new(
            &UsageFormat::Header(http::HeaderName::from_static("x-tokens")),
            &head,
        );
        drop(reading(Full::new(Bytes::new()), reader, &seeing));
        assert_eq!(seeing.read(), Some((Usage::total(7), BodyEnd::Complete)));
    }
}
