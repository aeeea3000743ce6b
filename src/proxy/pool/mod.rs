//! Keep-alive HTTP/1.1 connections (over TLS for `https`) to one upstream target: newest idle first, each exchange
//! run in the request's own task, the connection returned when the response ends; an answer silent past its read
//! timeout cut.

mod connect;
mod idle;
mod lease;
mod send;
#[cfg(test)]
mod tests;
mod wire;

pub use send::{ConnectionPool, PoolSettings, SendError, Sent};
