//! Keep-alive HTTP/1.1 connections (over TLS for `https`) to one upstream target: newest idle first, returned when
//! the response ends.

mod connect;
mod idle;
mod lease;
mod send;
#[cfg(test)]
mod tests;

pub use send::{ConnectionPool, PoolSettings, SendError};
