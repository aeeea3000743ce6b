//! The problems found while validating, each on the path of its field (`routes[1].limits[0].period`).

use std::fmt;

/// A problem on one field, before it is given a place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issue {
    /// `routes[1].limits[0].period`, or `""` for the whole file.
    pub path: String,
    pub message: String,
}

/// The problems found so far.
#[derive(Debug, Default)]
pub(crate) struct Issues(Vec<Issue>);

// === impl Issues ===

impl Issues {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(Issue {
            path: path.into(),
            message: message.to_string(),
        });
    }

    /// The value, or `None` with the error recorded on `path`.
    pub(crate) fn check<T, E: fmt::Display>(
        &mut self,
        path: impl Into<String>,
        result: Result<T, E>,
    ) -> Option<T> {
        result.map_err(|e| self.add(path, e)).ok()
    }

    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn into_vec(self) -> Vec<Issue> {
        self.0
    }
}

impl fmt::Display for Issues {
    /// `path: message`, joined by `; ` (for problems reported outside a file, e.g. by the admin API).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            let separator = if i == 0 { "" } else { "; " };
            write!(f, "{separator}{}: {}", issue.path, issue.message)?;
        }
        Ok(())
    }
}
