//! What admission keeps of an admitted request until its answer ends: an [`AnswerGuard`] that travels with the
//! response body ([`GuardedBody`], the one guard of an answer) and runs its work once, when the body's last frame is
//! sent (its end, its trailers, or a frame after which it says it has ended), when the answer is cut (the client
//! went away, the response or the request future was dropped) or when it fails (the upstream failed, the body broke).
//! On a route with `usage:` the same body reads what the answer reports it cost as it passes, and hands that to the
//! work just before it ends. Costs known only after the answer are settled there and concurrency slots released
//! there; a request whose limits keep nothing for after carries no guard, and its body is not wrapped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body as HttpBody, Frame, SizeHint};

#[cfg(not(feature = "llm"))]
use no_reading::UsageRead;
#[cfg(feature = "llm")]
use reading::UsageRead;

#[cfg(feature = "llm")]
use crate::usage::Handed;

#[cfg(feature = "llm")]
mod reading;

/// Without the `llm` feature no answer's usage is read: a body's room for a reading is never filled.
#[cfg(not(feature = "llm"))]
mod no_reading {
    use std::pin::Pin;

    use bytes::Bytes;
    use http_body::Frame;

    use super::{AnswerGuard, Ending};

    /// A reading that cannot be made (the type has no value).
    pub(super) struct UsageRead<B>(
        std::convert::Infallible,
        std::marker::PhantomData<fn() -> B>,
    );

    impl<B> UsageRead<B> {
        pub(super) fn frame(&mut self, _: &Frame<Bytes>) {
            match self.0 {}
        }

        pub(super) fn ended(self, _: Ending, _: &mut AnswerGuard) {
            match self.0 {}
        }

        pub(super) fn dropped(self, _: Pin<&mut B>, _: &mut AnswerGuard) {
            match self.0 {}
        }
    }
}

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
    #[cfg(feature = "llm")]
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
    #[cfg(feature = "llm")]
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
                read.dropped(this.inner, this.guard);
            }
        }
    }
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
            read.ended(ending, this.guard);
        }
        this.guard.end(ending);
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
                    read.frame(frame);
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
