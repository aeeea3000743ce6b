//! `tollgate_decisions_total` of one limit, and the rule of what a request's decision counts on it: written once for
//! the gateway's routes, the tower layer and Envoy's rate limit service, so that a dashboard reads them alike.

/// `tollgate_decisions_total{route,limit,...,decision}` of one limit, registered once (at 0, so that a
/// series exists before its first decision).
#[derive(Debug, Clone)]
pub(crate) struct DecisionCounters {
    allowed: metrics::Counter,
    denied: metrics::Counter,
    shadow_denied: metrics::Counter,
}

/// What one limit's part in one request's decision counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// The request was admitted, and the limit admitted it (or only would have refused it, in shadow).
    Allowed,
    /// The limit refused the request.
    Denied,
    /// A shadow limit would have refused: counted whatever the request's fate.
    ShadowDenied,
    /// Nothing: the request was refused by another limit, and this one took nothing and decided nothing.
    Nothing,
}

impl DecisionCounters {
    /// The counters of one limit, `labels` naming it (`route` and `limit`, and a plan's limit its `plan`, never
    /// the consumer: one series per consumer would grow without bound), each with its `decision` after them.
    pub(crate) fn new(labels: &[(&'static str, &str)]) -> Self {
        let counter = |decision: &'static str| {
            let labels: Vec<(&'static str, String)> = labels
                .iter()
                .map(|&(name, value)| (name, value.to_owned()))
                .chain([("decision", decision.to_owned())])
                .collect();
            metrics::counter!("tollgate_decisions_total", &labels)
        };
        Self {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
        }
    }

    /// Counts one limit's part in a decision: every limit of an admitted request counts as allowed; of a refused
    /// request only the refusing limits count (the others took nothing); a `shadow` limit that would refuse
    /// counts as shadow-denied whatever the request's fate.
    pub(crate) fn count(&self, shadow: bool, admitted: bool, refuses: bool) -> Counted {
        let (counter, counted) = match (shadow, admitted, refuses) {
            (true, _, true) => (&self.shadow_denied, Counted::ShadowDenied),
            (_, true, _) => (&self.allowed, Counted::Allowed),
            (false, false, true) => (&self.denied, Counted::Denied),
            (_, false, false) => return Counted::Nothing,
        };
        counter.increment(1);
        counted
    }
}
