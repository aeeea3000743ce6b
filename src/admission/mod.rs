//! Admission: the request path the gateway and the tower layer share (design §11). A [`Policy`] decides a request
//! from its key facts: allowlist, keys, one limiter call, the 429 / 503 / 400 answers, delays, and the fields of
//! an admitted response.

mod headers;
mod limits;
mod policy;
mod responses;

pub use limits::{LimitSet, LimitSettings, NotChecked, Replaced, Verdict};
pub use policy::{Admission, Admitted, Policy};
pub(crate) use responses::json_response;
pub use responses::{caller_refused, refused};
