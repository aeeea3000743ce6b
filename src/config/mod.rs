//! The YAML configuration: parsing, environment interpolation, units, validation with file locations.

mod consumers;
mod error;
mod interpolate;
#[cfg(feature = "jwt")]
mod jwt;
mod limits;
mod load;
mod locate;
mod model;
mod raw;
mod rls;
pub mod summary;
mod validate;

pub use error::{ConfigError, Problem};
pub use load::{load, load_for_layers, load_with_text, parse, parse_for_layers, parse_with_env};
pub use model::*;
pub(crate) use rls::ratelimit_files;
pub(crate) use validate::{mark_credential_keys, secret_api_keys};

/// What may name a consumer (a consumers' word, named here as the config checks it).
pub use crate::consumers::consumer_id;
/// The route name plan limits' store keys use (a store key's word, named here as the config reserves it).
pub use crate::key::PLAN_KEY_SCOPE;
/// Units of time and rate are the limiter's; named here too, as the config file writes them.
pub use crate::limiter::{format_duration_ms, parse_duration, parse_rate, UnitError};
