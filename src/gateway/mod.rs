//! The gateway itself: per request, find the route, build the keys, ask the limiter, then forward or refuse.

mod compiled;
mod handler;
mod responses;
mod serve;
#[cfg(test)]
mod tests;
mod usage;

pub use compiled::CompiledConfig;
pub use handler::{Gateway, RequestView};
pub use responses::readiness;
pub use serve::serve;
