//! The YAML configuration: parsing, environment interpolation, units, validation with file locations.

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

pub use error::{ConfigError, Problem};
pub use load::{load, parse, parse_with_env};
pub use model::*;
pub use units::{parse_duration, parse_rate, UnitError};

/// Formats milliseconds the way the config file writes durations (`250ms`, `2s`, `1m`, `1h`, `1d`).
pub fn format_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}
