//! Checks shared by the fuzz targets, so that every config target holds the loader to the same promises.

use std::path::Path;

use tollgate::config::{summary, Config, ConfigError};

/// The file name the targets pass to the loader, which every problem must repeat.
pub const FILE: &str = "fuzz.yaml";

/// Asserts what the loader promises whatever the input: a refusal names at least one problem, each placed on a
/// line and column of `text` and formatted as `fuzz.yaml:LINE:COL: ...`; an accepted config can be summarised.
pub fn check_config_outcome(text: &str, outcome: &Result<Config, ConfigError>) {
    match outcome {
        Ok(config) => check_accepted(config),
        Err(err) => check_refused(text, err),
    }
}

fn check_refused(text: &str, err: &ConfigError) {
    let ConfigError::Invalid { problems } = err else {
        panic!("parsing text cannot fail to read a file: {err}");
    };
    assert!(!problems.is_empty(), "a refused config names no problem");
    let shown = err.to_string();
    assert!(!shown.is_empty(), "a refused config displays as nothing");
    // YAML counts CR, NEL, LS and PS as line ends as well as LF; counting all of them gives an upper bound that
    // holds whichever parser placed the problem. libyaml ends an unterminated last line before reporting an error
    // at the end of the stream, so such an error sits on the line after it.
    let is_break = |c: char| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}');
    let unterminated = text.chars().last().is_some_and(|c| !is_break(c));
    let last_line = 1 + text.chars().filter(|&c| is_break(c)).count() + usize::from(unterminated);
    for problem in problems {
        assert!(
            problem.line() >= 1 && problem.column() >= 1,
            "problem without a location: {problem:?}"
        );
        assert!(
            problem.line() <= last_line,
            "problem placed on line {} of a {last_line}-line file: {problem:?}",
            problem.line()
        );
        assert_eq!(problem.file(), Path::new(FILE));
        assert!(
            !problem.message().is_empty(),
            "problem without a message: {problem:?}"
        );
        let line = problem.to_string();
        let location = format!("{FILE}:{}:{}: ", problem.line(), problem.column());
        assert!(
            line.starts_with(&location),
            "{line:?} does not start with {location:?}"
        );
    }
}

fn check_accepted(config: &Config) {
    // `tollgate check` prints this for every accepted file, so it must not panic either, and it must show every
    // route the gateway will serve.
    let table = summary::render(config);
    for route in &config.routes {
        assert!(
            table.contains(&route.name),
            "route {:?} missing from the summary:\n{table}",
            route.name
        );
    }
}
