//! The gateway itself: per request, find the route, build the keys, ask the limiter, then forward or refuse.

mod compiled;
mod handler;
mod responses;
#[cfg(test)]
mod tests;
mod usage;

pub use crate::server::{serve, ServeError};
pub use compiled::CompiledConfig;
pub(crate) use handler::handle_on;
pub use handler::{Gateway, RequestView};
pub use responses::readiness;
