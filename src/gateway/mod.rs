//! The gateway's request path: per request, find the route, build the keys, ask the limiter, then forward or refuse;
//! the connections that read the requests are `server`'s.

mod compiled;
mod handler;
mod reloads;
mod responses;
mod serve;
#[cfg(test)]
mod tests;
mod usage;

pub use crate::admission::RequestView;
pub use compiled::CompiledConfig;
pub use handler::Gateway;
pub use reloads::Reload;
pub use responses::readiness;
pub use serve::{serve, Listeners};
