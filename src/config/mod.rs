//! The YAML configuration: parsing, environment interpolation, units, validation with file locations.

mod consumers;
mod error;
mod interpolate;
mod limits;
mod load;
mod locate;
mod model;
mod raw;
pub mod summary;
mod units;
mod validate;

pub use consumers::{consumer_id, PLAN_KEY_SCOPE};
pub use error::{ConfigError, Problem};
pub(crate) use limits::{replaced, Replaced};
pub(crate) use load::parse_consumers;
pub use load::{load, load_for_layers, load_with_text, parse, parse_for_layers, parse_with_env};
pub use model::*;
pub use units::{parse_duration, parse_rate, UnitError};
pub(crate) use validate::{mark_credential_keys, secret_api_keys};

pub use crate::limiter::format_duration_ms;
