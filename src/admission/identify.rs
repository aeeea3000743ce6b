//! Identify: who calls, on a route with consumers (an API key, a JWT), refused with 401, 403 or 400 when the
//! credential is missing, wrong or sent twice, and unchecked once its address is past its failed credentials.

use super::policy::Policy;
use super::refusal::Refusal;
use crate::consumers::{Caller, CallerRefusal};
use crate::key::RequestFacts;
use crate::limiter::RateLimiter;

// === impl Policy ===

impl Policy {
    /// The caller of the request `facts` describes, on a route that identifies callers (`None` elsewhere), or why
    /// it is refused. A wrong credential counts against its address (`consumers.failed_credentials`).
    pub(super) async fn identify(
        &self,
        limiter: &RateLimiter,
        facts: &RequestFacts<'_>,
    ) -> Result<Option<Box<Caller>>, Refusal> {
        let Some(policy) = self.identifying() else {
            return Ok(None);
        };
        let consumers = &policy.consumers;
        let failures = consumers.failures();
        // An address past its failed credentials has its credentials refused unchecked.
        if let Some(wait) = failures
            .and_then(|f| f.blocked_for(facts.client_ip, facts.ipv6_prefix))
            .filter(|_| consumers.presents_credential(facts))
        {
            return Err(Refusal::TooManyFailedCredentials { wait });
        }
        let refusal = match consumers.identify_reading_through(facts, policy.mode).await {
            // Boxed: a route without consumers carries no room for a caller.
            Ok(caller) => return Ok(Some(Box::new(caller))),
            Err(refusal) => refusal,
        };
        if let (CallerRefusal::Invalid { .. }, Some(failures)) = (&refusal, failures) {
            // Boxed: only a failure pays for the count's future.
            let counted = Box::pin(failures.count(limiter, facts.client_ip, facts.ipv6_prefix));
            if let Some(wait) = counted.await {
                return Err(Refusal::TooManyFailedCredentials { wait });
            }
        }
        Err(match refusal {
            CallerRefusal::Ambiguous => Refusal::AmbiguousKey,
            refusal => Refusal::Caller(refusal),
        })
    }
}
