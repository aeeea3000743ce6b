//! Limiting keys: which client a request belongs to (its address, seen through trusted proxies), what a limit's
//! key is built from (the address, a header, a query parameter, the route...), and the store key that holds its
//! state.

mod client_cert;
mod client_ip;
mod limit;
mod spec;
mod store_key;

pub use client_cert::ClientCertificate;
pub use client_ip::{
    believed_hops, ip_text, push_ip_bytes, push_ip_text, ClientIpHeader, ClientIpResolver,
};
pub use limit::{Counts, LimitSettings, StatusSet, TokenKind};
pub use spec::{
    names_parameter, push_client_key, push_escaped, push_key_text, query_parameter, trimmed_value,
    AmbiguousKey, KeyPart, KeyPartError, KeySpec, MissingKey, QueryParameter, RequestFacts,
    BYTES_MARK,
};
pub use store_key::{
    key_head, key_with_head, seal_key, store_key, MAX_PLAIN_KEY_LEN, PLAN_KEY_SCOPE,
};
