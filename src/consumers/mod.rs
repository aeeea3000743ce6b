//! Consumers and plans (see docs/configuration.md, "Consumers and plans"): who calls, on which plan, and how much each plan may take across every route
//! and every gateway instance.

mod api_key;
pub mod directory;
mod failures;
mod hide;
mod identify;
pub mod json;
#[cfg(feature = "jwt")]
pub mod jwt;
mod overrides;
mod settings;

pub use api_key::{
    digest as api_key_digest, digest_hex, parse_digest, parse_hex_digest, presented, Presented,
};
pub use failures::{FailureLimit, FailureSettings};
pub use hide::hide;
pub use identify::{Caller, CallerRefusal, Consumers};
pub use overrides::overridden;
pub use settings::{
    consumer_id, consumer_id_char, Anonymous, ConsumerMode, ConsumersSettings, CredentialSource,
    ForwardHeaders, IdentifierSettings, Plan, StaticKey, DEFAULT_MTLS_PREFIX,
};
