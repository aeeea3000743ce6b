//! What an answer's body reported it cost, as the body that read it hands it over when it ends ([`Handed`]), and the
//! rest of an answer its client left before its usage was known, to be read on ([`Unread`]). The body that reads
//! is admission's one guard of the answer (`GuardedBody`), which knows every ending.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;

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

/// What a body that read its answer's usage hands over, once, as it ends.
#[derive(Debug)]
pub enum Handed {
    /// The usage, as the body ended.
    Read(Usage, BodyEnd),
    /// The body was dropped before its end with its usage still to come.
    Cut(Box<Unread>),
}

/// The rest of an answer its client left before its usage was known, with the reader that read its start.
pub struct Unread {
    body: Body,
    reader: UsageReader,
}

// === impl Handed ===

impl Handed {
    /// What a body read by `reader` hands over when it is dropped before its end, `rest` being the body still unread
    /// (taken only when the usage may still come from it): the usage whole already (a header), the rest to read on,
    /// or what was read so far, cut.
    pub fn dropped(reader: UsageReader, rest: impl FnOnce() -> Option<Body>) -> Self {
        if reader.is_whole() {
            // The usage came whole before the body (a header): leaving early changes nothing.
            return Handed::Read(reader.usage(), BodyEnd::Complete);
        }
        if reader.may_learn_more() {
            if let Some(body) = rest() {
                return Handed::Cut(Box::new(Unread { body, reader }));
            }
        }
        Handed::Read(reader.usage(), BodyEnd::Cut)
    }

    /// What a body read by `reader` hands over when it ends as `end` (never [`BodyEnd::Cut`]: see
    /// [`dropped`](Self::dropped)): a whole body's last event is read even without its blank line.
    pub fn ended(mut reader: UsageReader, end: BodyEnd) -> Self {
        if end == BodyEnd::Complete {
            reader.finish();
        }
        Handed::Read(reader.usage(), end)
    }
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
