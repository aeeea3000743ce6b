//! What admission keeps of an admitted request until its answer ends: an [`AnswerGuard`] that travels with the
//! response body ([`GuardedBody`], the one guard of an answer) and runs its work once, when the body's last frame is
//! sent (its end, its trailers, or a frame after which it says it has ended), when the answer is cut (the client
//! went away, the response or the request future was dropped) or when it fails (the upstream failed, the body broke).
//! On a route with `usage:` the same body reads what the answer reports it cost as it passes, and hands that to the
//! work just before it ends. Costs known only after the answer are settled there and concurrency slots released
//! there; a request whose limits keep nothing for after carries no guard, and its body is not wrapped.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::StatusCode;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::usage::{BodyEnd, Handed, UsageReader};

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its body's last frame was taken: the whole answer went out (as far as the server can tell).
    Complete,
    /// Dropped before its end: the client went away or stopped the stream, or the request was abandoned before
    /// the upstream answered.
    Cut,
    /// The upstream failed (unreachable, timed out, its body broke): the answer is an error or was cut by one.
    Failed,
}

/// Work that runs once an admitted request's answer ends. `status` is told the answer's status as soon as it is
/// known (never, when the upstream failed before answering); `ended` runs exactly once, never on the client's path
/// (it must not block: what needs the store is sent off to be batched).
pub trait AfterAnswer: Send + 'static {
    /// The answer's status, once the response head is known.
    fn status(&mut self, status: StatusCode) {
        let _ = status;
    }

    /// What the answer's body reported it cost, on a route with `usage:`: handed once, just before `ended`.
    fn usage(&mut self, handed: Handed) {
        let _ = handed;
    }

    /// The answer ended as `ending` says.
    fn ended(self: Box<Self>, ending: Ending);
}

/// Holds an [`AfterAnswer`] until the answer ends: told how it ended at most once, and cut if dropped untold.
pub struct AnswerGuard {
    work: Option<Box<dyn AfterAnswer>>,
    /// How the answer ended if the guard is dropped untold: cut, unless its body was known to be empty.
    on_drop: Ending,
}

impl std::fmt::Debug for AnswerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerGuard")
            .field("ended", &self.work.is_none())
            .finish()
    }
}

// === impl AnswerGuard ===

impl AnswerGuard {
    /// A guard running `work` when the answer ends.
    pub fn new(work: Box<dyn AfterAnswer>) -> Self {
        Self {
            work: Some(work),
            on_drop: Ending::Cut,
        }
    }

    /// Tells the work the answer's status.
    pub fn status(&mut self, status: StatusCode) {
        if let Some(work) = &mut self.work {
            work.status(status);
        }
    }

    /// Hands the work what the answer's body reported it cost.
    fn usage(&mut self, handed: Handed) {
        if let Some(work) = &mut self.work {
            work.usage(handed);
        }
    }

    /// Runs the work with `ending`, unless it already ran.
    pub fn end(&mut self, ending: Ending) {
        if let Some(work) = self.work.take() {
            work.ended(ending);
        }
    }
}

impl Drop for AnswerGuard {
    fn drop(&mut self) {
        self.end(self.on_drop);
    }
}

pin_project_lite::pin_project! {
    /// A response body carrying the [`AnswerGuard`] of its request: [`Ending::Complete`] once its last frame is
    /// taken, [`Ending::Failed`] when it yields an error, [`Ending::Cut`] when dropped before either; on a route with
    /// `usage:`, the answer's usage read from its frames on their way through (untouched) and handed to the work as
    /// it ends, with the rest of the answer when the client left before the usage came.
    #[project = GuardedBodyProj]
    pub struct GuardedBody<B> {
        #[pin]
        inner: B,
        guard: AnswerGuard,
        // The answer's usage being read, on a route with `usage:`; `None` elsewhere, and once handed over. Boxed:
        // the bodies of routes without `usage:` carry no room for a reader.
        usage: Option<Box<UsageRead<B>>>,
    }

    impl<B> PinnedDrop for GuardedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped before its end: what was read goes to the work before the guard, dropped next, ends it.
            if let Some(read) = this.usage.take() {
                let UsageRead { reader, rest } = *read;
                let handed = Handed::dropped(reader, || rest(this.inner));
                this.guard.usage(handed);
            }
        }
    }
}

/// The reading of an answer's usage as its body passes.
struct UsageRead<B> {
    reader: UsageReader,
    /// Takes the rest of the body, unless it has ended, for its usage to be read on after the client left.
    rest: fn(Pin<&mut B>) -> Option<Body>,
}

// === impl GuardedBody ===

impl<B> GuardedBody<B> {
    /// `inner`, running `guard` when it ends.
    pub fn new(inner: B, mut guard: AnswerGuard) -> Self
    where
        B: HttpBody,
    {
        // A server that knows a body is empty (it says so, or the answer has none: HEAD, 204, 304) sends the head
        // and may drop the body unread: that answer is whole once sent, not cut.
        if inner.is_end_stream() {
            guard.on_drop = Ending::Complete;
        }
        Self {
            inner,
            guard,
            usage: None,
        }
    }

    /// Ends the answer as `ending` says: the usage read (if any) is handed over first.
    fn end(this: GuardedBodyProj<'_, B>, ending: Ending) {
        if let Some(read) = this.usage.take() {
            let end = match ending {
                Ending::Complete => BodyEnd::Complete,
                Ending::Failed => BodyEnd::Failed,
                Ending::Cut => BodyEnd::Cut,
            };
            this.guard.usage(Handed::ended(read.reader, end));
        }
        this.guard.end(ending);
    }
}

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

impl<B: HttpBody<Data = Bytes>> HttpBody for GuardedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(None) => Self::end(this, Ending::Complete),
            Poll::Ready(Some(Err(_))) => Self::end(this, Ending::Failed),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(read) = this.usage.as_mut() {
                    if let Some(data) = frame.data_ref() {
                        read.reader.feed(data);
                    } else if let Some(trailers) = frame.trailers_ref() {
                        read.reader.trailers(trailers);
                    }
                }
                // hyper's HTTP/1 server takes no more frames after trailers, nor after a data frame once the body
                // says it has ended (a known length fully read): it drops the body there, and the answer is whole.
                if frame.is_trailers() || this.inner.is_end_stream() {
                    Self::end(this, Ending::Complete);
                }
            }
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

/// A record of the answers that ended, for the tests of the seam in every entry point.
#[cfg(test)]
pub(crate) mod recording {
    use std::sync::Arc;

    use http::StatusCode;
    use parking_lot::Mutex;

    use super::{AfterAnswer, Ending};

    /// The status an answer was told (if any) and how it ended.
    pub(crate) type Ended = (Option<StatusCode>, Ending);

    /// What each answer was told and how it ended, in the order they ended.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Endings(Arc<Mutex<Vec<Ended>>>);

    struct Work {
        status: Option<StatusCode>,
        endings: Endings,
    }

    impl Endings {
        /// Makes the work of one request, recording into these endings.
        pub(crate) fn work(&self) -> Box<dyn AfterAnswer> {
            Box::new(Work {
                status: None,
                endings: self.clone(),
            })
        }

        /// What ended so far, taken.
        pub(crate) fn take(&self) -> Vec<Ended> {
            std::mem::take(&mut *self.0.lock())
        }
    }

    impl AfterAnswer for Work {
        fn status(&mut self, status: StatusCode) {
            self.status = Some(status);
        }

        fn ended(self: Box<Self>, ending: Ending) {
            self.endings.0.lock().push((self.status, ending));
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures_util::{stream, StreamExt};
    use http::StatusCode;
    use http_body_util::{BodyExt, Empty, Full, StreamBody};

    use super::recording::Endings;
    use super::*;

    fn guarded<B: HttpBody>(body: B, endings: &Endings) -> GuardedBody<B> {
        let mut guard = AnswerGuard::new(endings.work());
        guard.status(StatusCode::OK);
        GuardedBody::new(body, guard)
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_is_complete_once() {
        let endings = Endings::default();
        let body = guarded(Full::new(Bytes::from_static(b"whole")), &endings);
        let bytes = body.collect().await.expect("body").to_bytes();
        assert_eq!(&bytes[..], b"whole");
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);
    }

    #[tokio::test]
    async fn a_body_whose_last_frame_says_it_ended_is_complete_without_being_asked_again() {
        // As hyper's HTTP/1 server reads a body of known length: the last data frame, then the body is dropped.
        let endings = Endings::default();
        let mut body = guarded(Full::new(Bytes::from_static(b"whole")), &endings);
        body.frame().await.expect("a frame").expect("data");
        drop(body);
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);

        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-usage", http::HeaderValue::from_static("7"));
        let frames = stream::iter([part(), Ok(Frame::trailers(trailers))]).chain(stream::pending());
        let mut body = guarded(StreamBody::new(frames), &endings);
        body.frame().await.expect("a frame").expect("data");
        assert!(endings.take().is_empty(), "data, more to come");
        body.frame().await.expect("a frame").expect("trailers");
        drop(body);
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_is_cut() {
        let endings = Endings::default();
        let frames = stream::iter([part()]).chain(stream::pending());
        let mut body = guarded(StreamBody::new(frames), &endings);
        let frame = body.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.into_data().ok().as_deref(), Some(&b"part"[..]));
        assert!(endings.take().is_empty(), "nothing ended yet");
        drop(body);
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Cut)]);
    }

    #[tokio::test]
    async fn a_body_that_breaks_has_failed_and_its_drop_changes_nothing() {
        let endings = Endings::default();
        let frames = stream::iter([part(), Err(std::io::Error::other("upstream reset"))]);
        let mut body = guarded(StreamBody::new(frames), &endings);
        body.frame().await.expect("a frame").expect("data");
        assert!(endings.take().is_empty(), "nothing ended yet");
        assert!(body.frame().await.expect("an item").is_err());
        drop(body);
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Failed)]);
    }

    #[test]
    fn an_empty_body_dropped_unread_is_complete() {
        let endings = Endings::default();
        drop(guarded(Empty::<Bytes>::new(), &endings));
        assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);
    }

    #[test]
    fn a_guard_dropped_before_any_answer_is_cut_without_a_status() {
        let endings = Endings::default();
        drop(AnswerGuard::new(endings.work()));
        assert_eq!(endings.take(), [(None, Ending::Cut)]);
    }

    fn part() -> Result<Frame<Bytes>, std::io::Error> {
        Ok(Frame::data(Bytes::from_static(b"part")))
    }
}

/// The answer's usage as [`GuardedBody`] reads it and hands it over, on a route with `usage:`.
#[cfg(test)]
mod reading_tests {
    use std::sync::Arc;

    use futures_util::stream;
    use http::{HeaderMap, HeaderValue};
    use http_body_util::{BodyExt, Full, StreamBody};
    use parking_lot::Mutex;

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
