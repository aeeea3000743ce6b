//! Why a config was refused: every problem with its file, line, column and field.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A config that could not be loaded. Its `Debug` is its `Display` (every problem, one a line), so that a
/// `main() -> Result<(), Box<dyn Error>>` that returns it prints the located problems rather than a struct dump.
#[derive(Clone, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the config file: {source}", file.display())]
    Read {
        /// The path as given.
        file: PathBuf,
        /// The I/O failure.
        source: Arc<io::Error>,
    },
    /// The file was read but is not a valid config. Holds at least one problem.
    #[error("{}", Lines(problems))]
    Invalid {
        /// Every problem found, in file order.
        problems: Vec<Problem>,
    },
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One thing wrong in a config file, displayed as `file:line:col: field.path: what is wrong`.
#[derive(Debug, Clone)]
pub struct Problem {
    file: PathBuf,
    line: usize,
    column: usize,
    path: String,
    message: String,
    /// The YAML parser's error, kept for callers that want its details.
    cause: Option<Arc<serde_yaml::Error>>,
}

/// Displays problems one per line.
struct Lines<'a>(&'a [Problem]);

// === impl ConfigError ===

impl ConfigError {
    /// Every problem, in file order; empty when the file could not be read.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Read { .. } => &[],
            ConfigError::Invalid { problems } => problems,
        }
    }

    pub(crate) fn read(file: &Path, source: io::Error) -> Self {
        ConfigError::Read {
            file: file.to_owned(),
            source: Arc::new(source),
        }
    }

    /// Sorts problems into file order; found problems follow the order of checks, users read files top down.
    pub(crate) fn invalid(mut problems: Vec<Problem>) -> Self {
        problems.sort_by_key(|p| (p.line, p.column));
        ConfigError::Invalid { problems }
    }
}

// === impl Problem ===

impl Problem {
    pub(crate) fn new(
        file: &Path,
        (line, column): (usize, usize),
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            file: file.to_owned(),
            line,
            column,
            path: path.into(),
            message: message.into(),
            cause: None,
        }
    }

    pub(crate) fn with_cause(mut self, cause: serde_yaml::Error) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// The config file, as given to the loader.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// 1-based line.
    pub fn line(&self) -> usize {
        self.line
    }

    /// 1-based column, in characters.
    pub fn column(&self) -> usize {
        self.column
    }

    /// The field, e.g. `routes[1].limits[0].period`; empty for the file as a whole.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.column)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for Problem {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod debug_tests {
    #[test]
    fn debug_reads_as_display_for_a_main_that_returns_it() {
        let error = crate::config::parse("routes: 7\n", std::path::Path::new("g.yaml"))
            .expect_err("routes must be a list");
        assert_eq!(format!("{error:?}"), error.to_string());
        assert!(format!("{error:?}").starts_with("g.yaml:1:"), "{error:?}");
    }
}
