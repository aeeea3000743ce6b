//! From the raw file to the validated [`Config`](super::Config), collecting every problem instead of stopping at
//! the first: one file per section of the config (`limits:` and `consumers:` are config's `limits` and
//! `consumers` modules), the checks they share, and the whole file's order.

mod admin;
mod checks;
mod client_cert;
mod client_ip;
mod file;
mod issues;
mod routes;
mod server;
mod store;
mod upstreams;

#[cfg(test)]
// A failed unwrap is a failed test, with the value in the message.
#[allow(clippy::unwrap_used)]
mod tests;

pub(crate) use checks::{check_name, socket_addr, unique_names};
pub(crate) use client_cert::in_consumers as client_cert_in_consumers;
pub(crate) use file::{validate, Reader};
pub(crate) use issues::Issues;
