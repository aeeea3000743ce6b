//! Routing: the one canonical view of a request (§7 of the design), the path normalisation it rests on, and the
//! route matchers that take it (first match wins).

mod canonical;
mod matcher;
mod path;

pub use canonical::{canonical_host, CanonicalRequest, Refusal};
pub use matcher::{Matcher, RequestTarget, RouteMatch};
pub use path::{normalize_path, PathError};
