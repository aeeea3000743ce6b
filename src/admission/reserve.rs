//! Whether a request reserves tokens before it is forwarded: [`NoReservation`] on routes without `usage:` (every
//! route, in a build without the `llm` feature), whose token code compiles to nothing; a `Reservation` (`tokens.rs`)
//! on the others.

use std::time::Instant;

use axum::body::Body;
use axum::BoxError;
use bytes::Bytes;
use http::Response;

use super::after_answer::{AfterAnswer, AnswerGuard, GuardedBody};
use super::limits::{Checked, LimitSet};
use super::settle::StatusSettlement;
use crate::key::{RequestFacts, TokenKind};
use crate::limiter::{Giver, Limit};

/// Whether a request reserves tokens: [`NoReservation`] (the type makes the token code vanish from its path), or a
/// reservation, which reserves on the token limits, settles them once the answer ends, and reads the answer's usage.
pub trait Reserve: Copy + Send + Sync {
    /// The limits reserved for one check, each with the index of the limit it stands for: nothing at all (not even
    /// an empty vector's room) without a reservation.
    type Reserved: FromIterator<(usize, Limit)> + AsRef<[(usize, Limit)]> + Send;

    /// Whether the request reserves tokens at all.
    fn reserves(&self) -> bool;

    /// What the request reserves on a limit counting `kind`.
    fn tokens(&self, kind: TokenKind) -> u64;

    /// The work an admitted request keeps for after its answer (asked at `asked`, admitted as `checked` by
    /// `limits`): the settlement of its token limits, with `statuses`' give-backs in the same box, or `statuses`
    /// alone when it settles no tokens.
    fn settlement(
        self,
        limits: &LimitSet,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        giver: Giver,
        asked: Instant,
        statuses: Option<StatusSettlement>,
    ) -> Option<Box<dyn AfterAnswer>>;

    /// `response`, its body carrying `after` (and read for the usage its answer reports, when the request reserved).
    fn guard<B>(self, response: Response<B>, after: AnswerGuard) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>;
}

/// The reservation of a request on a route without `usage:`: none.
#[derive(Debug, Clone, Copy)]
pub struct NoReservation;

/// The reserved limits of a check without a reservation: none, in no room.
#[derive(Debug, Default)]
pub struct NothingReserved;

// === impl NoReservation ===

impl Reserve for NoReservation {
    type Reserved = NothingReserved;

    #[inline(always)]
    fn reserves(&self) -> bool {
        false
    }

    #[inline(always)]
    fn tokens(&self, _: TokenKind) -> u64 {
        0
    }

    #[inline(always)]
    fn settlement(
        self,
        _: &LimitSet,
        _: &RequestFacts<'_>,
        _: &Checked,
        _: Giver,
        _: Instant,
        statuses: Option<StatusSettlement>,
    ) -> Option<Box<dyn AfterAnswer>> {
        statuses.map(|s| Box::new(s) as Box<dyn AfterAnswer>)
    }

    #[inline(always)]
    fn guard<B>(self, response: Response<B>, after: AnswerGuard) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        response.map(|body| Body::new(GuardedBody::new(body, after)))
    }
}

// === impl NothingReserved ===

impl FromIterator<(usize, Limit)> for NothingReserved {
    #[inline(always)]
    fn from_iter<I: IntoIterator<Item = (usize, Limit)>>(_: I) -> Self {
        NothingReserved
    }
}

impl AsRef<[(usize, Limit)]> for NothingReserved {
    #[inline(always)]
    fn as_ref(&self) -> &[(usize, Limit)] {
        &[]
    }
}
