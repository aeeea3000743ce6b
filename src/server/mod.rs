//! The connections: listeners, HTTP/1 and HTTP/2 connections and their clocks, drain and shutdown, running out of
//! file descriptors.

pub(crate) mod body_framing;
mod connection;
mod descriptors;
mod direct;
mod drain;
mod h2_clock;
mod handler;
mod http1;
mod idle;
mod listener;
mod settings;
mod shutdown;
#[cfg(test)]
mod tests;
mod tls;

pub use descriptors::{AdminListener, Reserve, ADMIN_RESERVE};
pub use handler::{BoxError, Handler};
pub use listener::{serve, serve_tls, ServeError};
pub use settings::Settings;
pub use shutdown::Shutdown;
pub use tls::{ClientMark, TlsConfig};
