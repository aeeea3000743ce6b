//! Records what a release build was made from, for `tollgate --version`: the git commit, and whether the sources
//! built differed from it, so that two builds of one version can be told apart in a rolling upgrade.

use std::process::Command;

/// What the build's sources are: the paths whose changes change the binary (docs and tests do not).
const SOURCES: [&str; 5] = ["src", "crates", "Cargo.toml", "Cargo.lock", "build.rs"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Release builds only: a commit recorded in every build would rebuild the whole package, its tests included,
    // after each commit of the edit-build-test loop, where no one asks which commit a build is.
    if std::env::var("PROFILE").as_deref() != Ok("release") {
        println!("cargo:rustc-env=TOLLGATE_BUILD=debug build, no commit recorded");
        return;
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        // Built from a source archive, or where git is missing or refuses the directory.
        println!("cargo:rustc-env=TOLLGATE_BUILD=no git commit");
        return;
    };
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(SOURCES);
    let build = match git(&status) {
        Some(changes) if !changes.is_empty() => format!("commit {commit}, modified"),
        Some(_) => format!("commit {commit}"),
        None => format!("commit {commit}, modification unknown"),
    };
    println!("cargo:rustc-env=TOLLGATE_BUILD={build}");
    // Recorded again when the commit moves (HEAD, the branch it names, refs packed by gc) or the sources change.
    for path in SOURCES {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "--quiet", "HEAD"]),
    ) {
        println!("cargo:rerun-if-changed={common}/{branch}");
        println!("cargo:rerun-if-changed={common}/packed-refs");
    }
}

/// What `git args` prints, trimmed; `None` when it fails.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
