//! Routing: the one canonical view of a request (docs/responses.md), the path normalisation it rests on, the
//! route matchers that take it (first match wins), and the index that finds the first among many routes.

mod canonical;
mod index;
mod matcher;
mod path;

pub use canonical::{canonical_host, CanonicalRequest, Refusal};
pub use index::RouteIndex;
pub use matcher::{Matcher, RequestTarget, RouteMatch};
pub use path::{normalize_path, normalize_path_with, without_parameters, PathError, PathRules};
