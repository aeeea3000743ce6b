//! The connections: listeners, HTTP/1 and HTTP/2 connections and their clocks, drain and shutdown, running out of
//! file descriptors.

mod connection;
mod descriptors;
mod drain;
mod h2_clock;
mod http1;
mod idle;
mod shutdown;

pub use connection::{serve, ServeError};
pub use descriptors::{AdminListener, Reserve, ADMIN_RESERVE};
pub use shutdown::Shutdown;
