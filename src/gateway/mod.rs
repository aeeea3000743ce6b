//! The gateway itself: per request, find the route, build the keys, ask the limiter, then forward or refuse.

mod compiled;
mod descriptors;
mod drain;
mod h2_clock;
mod handler;
mod http1;
mod idle;
mod responses;
mod server;
mod shutdown;
#[cfg(test)]
mod tests;
mod usage;

pub use compiled::CompiledConfig;
pub use descriptors::{AdminListener, Reserve, ADMIN_RESERVE};
pub use handler::{Gateway, RequestView};
pub use responses::readiness;
pub use server::{serve, ServeError};
pub use shutdown::Shutdown;
