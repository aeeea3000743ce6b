//! Arbitrary bytes as a config file: the loader must never panic, and every refusal must point into the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tollgate_fuzz::check_config_outcome;

fuzz_target!(|data: &[u8]| {
    // Config files come from disk as bytes; the binary reads them as UTF-8, so invalid sequences are covered by
    // the read path, and the parser is fuzzed on what survives a lossy decode.
    let text = String::from_utf8_lossy(data);
    // No environment: every `${VAR}` without a default must be reported, not panic or vanish.
    let outcome = tollgate::config::parse_with_env(&text, Path::new("fuzz.yaml"), |_| None);
    check_config_outcome(&text, &outcome);
});
