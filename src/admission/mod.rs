//! Admission: the request path the gateway and the tower layer share (see docs/development.md, "Layout"). A [`Policy`] decides a request
//! from its key facts: allowlist, the caller and its plan, keys, one limiter call, the 429 / 503 / 401 / 403 / 400
//! answers, delays, the fields of an admitted response and the consumer headers sent on.

mod headers;
mod held;
mod limits;
mod policy;
mod responses;

/// A limit with its key spec, as admission takes it (the key module's type, named here too).
pub use crate::key::LimitSettings;
pub use limits::{LimitSet, NotChecked, Replaced, Verdict};
pub use policy::{Admission, Admitted, Policy};
pub(crate) use responses::json_response;
pub use responses::{caller_refused, ensure_request_id, refused, X_REQUEST_ID};
