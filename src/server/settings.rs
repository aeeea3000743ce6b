//! What a server needs to know of its connections: their clocks, the largest request head, the drain's grace.

use std::time::Duration;

/// A server's connection settings (the gateway makes them from `server:` in its config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// How long a request head may take to arrive, from its first byte (and a connection its opening).
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub keepalive_timeout: Duration,
    /// The largest request head read, request line and fields counted as HTTP/1.1 writes them.
    pub max_header_bytes: usize,
    /// How long the connections open at shutdown get to finish.
    pub shutdown_grace: Duration,
}
