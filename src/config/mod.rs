//! The configuration: its model (what the rest of tollgate runs on) and, with the `yaml` feature, the reading of a
//! YAML file into it: environment interpolation, units, validation with file locations.

// Reading a file: everything from the text to the validated model. Without `yaml` a program builds the model's
// values in code (the tower layer's builder), and compiles no YAML parser.
#[cfg(feature = "yaml")]
mod consumers;
#[cfg(feature = "yaml")]
mod error;
#[cfg(feature = "yaml")]
mod interpolate;
#[cfg(all(feature = "yaml", feature = "jwt"))]
mod jwt;
#[cfg(feature = "yaml")]
mod limits;
#[cfg(feature = "yaml")]
mod load;
#[cfg(feature = "yaml")]
mod locate;
#[cfg(feature = "yaml")]
mod raw;
#[cfg(feature = "yaml")]
mod rls;
#[cfg(feature = "yaml")]
mod telemetry;
#[cfg(feature = "yaml")]
mod tls;
#[cfg(feature = "yaml")]
mod validate;

mod model;
// Applied to the config's limits as it is read, and to the tower layer's own.
#[cfg(any(feature = "yaml", feature = "layer"))]
mod secrets;
pub mod summary;

#[cfg(feature = "yaml")]
pub use error::{ConfigError, Problem};
#[cfg(feature = "yaml")]
pub use load::{load, load_for_layers, load_with_text, parse, parse_for_layers, parse_with_env};
pub use model::*;
// The gateway's reload reads `rls.config_dir` again.
#[cfg(feature = "gateway")]
pub(crate) use rls::ratelimit_files;
#[cfg(feature = "layer")]
pub(crate) use secrets::{mark_credential_keys, secret_api_keys};

/// What may name a consumer (a consumers' word, named here as the config checks it).
pub use crate::consumers::consumer_id;
/// The route name plan limits' store keys use (a store key's word, named here as the config reserves it).
pub use crate::key::PLAN_KEY_SCOPE;
/// Units of time and rate are the limiter's; named here too, as the config file writes them.
pub use crate::limiter::{format_duration_ms, parse_duration, parse_rate, UnitError};
