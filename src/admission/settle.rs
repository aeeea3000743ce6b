//! Settling what an admitted request reserved once its answer is known: a limit that counts answers by status
//! (`counts: { status: [401, 403] }`) takes its cost before the request is forwarded, all-or-nothing with the
//! route's other limits, and gets it back on the same window when the answer's status is not one it counts.

use std::time::Instant;

use http::StatusCode;

use super::after_answer::{AfterAnswer, Ending};
use crate::key::StatusSet;
use crate::limiter::{Giver, Limit};

/// The give-backs an admitted request owes, by the status its answer turns out to have. (`pub` in this private
/// module: [`Reserve`](super::Reserve)'s methods take it.)
#[derive(Debug)]
pub struct StatusSettlement {
    giver: Giver,
    /// Per limit that counts answers by status: its store key, the limit, and the statuses it counts.
    taken: Vec<(String, Limit, StatusSet)>,
    /// A moment before the decision, never after it: the give-back lands on the windows the decision took from
    /// (a sliding_log gives back its oldest entries from then on, which leaves it no emptier than giving back the
    /// decision's own would).
    asked: Instant,
    status: Option<StatusCode>,
}

// === impl StatusSettlement ===

impl StatusSettlement {
    pub(super) fn new(
        giver: Giver,
        taken: Vec<(String, Limit, StatusSet)>,
        asked: Instant,
    ) -> Self {
        Self {
            giver,
            taken,
            asked,
            status: None,
        }
    }
}

impl AfterAnswer for StatusSettlement {
    fn status(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    fn ended(self: Box<Self>, ending: Ending) {
        self.settle(ending);
    }
}

impl StatusSettlement {
    /// Gives back what the answer, ended as `ending`, does not count (also run by the token settlement, which
    /// carries this one on a route with both).
    pub(super) fn settle(self, ending: Ending) {
        let back: Vec<(String, Limit)> = match (self.status, ending) {
            // The status decides, however the body then ended.
            (Some(status), _) => self
                .taken
                .into_iter()
                .filter(|(_, _, statuses)| !statuses.contains(status.as_u16()))
                .map(|(key, limit, _)| (key, limit))
                .collect(),
            // The upstream failed before answering (unreachable, timed out): no answer with a counted status came.
            (None, Ending::Failed) => self
                .taken
                .into_iter()
                .map(|(key, limit, _)| (key, limit))
                .collect(),
            // The client went away before the status was known: the upstream may have seen the attempt (a
            // password tried), so it stays counted. Giving it back would let a client that hangs up early try
            // without limit.
            (None, Ending::Cut | Ending::Complete) => return,
        };
        // Queued with the store's other calls, never waited for: the answer is already on its way.
        self.giver.give_back(back, self.asked);
    }
}
