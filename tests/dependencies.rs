//! Every crate a package's Cargo.toml names is used: each `[dependencies]` crate is named as a path (`name::`) in
//! its src/, each `[dev-dependencies]` crate in its src/, tests/, benches/ or examples/; for the gateway and for
//! `crates/limiter` alike. An unused crate only costs build time and review (a library user's above all), and
//! nothing else would ever say it has become unused.

use std::fs;
use std::path::{Path, PathBuf};

/// The crate names (as code spells them: `-` read as `_`) of one `[section]` of Cargo.toml.
fn crates_of(manifest: &str, section: &str) -> Vec<String> {
    let header = format!("[{section}]");
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == header;
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, _)) = line.split_once('=') else {
            panic!("a line of {header} that names no crate: {line}");
        };
        // `name = ...` or `name.workspace = true`.
        let name = name.trim();
        let name = name.strip_suffix(".workspace").unwrap_or(name);
        names.push(name.replace('-', "_"));
    }
    names
}

/// The Rust files under `dir`, at any depth.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The code of the Rust files under `dirs`, comment lines left out (a crate named in a comment is not used).
fn code_under(package: &str, dirs: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(package);
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(!files.is_empty(), "no Rust files under {dirs:?}");
    let mut code = String::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("a readable source file");
        for line in text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
        {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

/// Whether `code` names the crate as the start of a path (`name::`, not `other_name::`) or re-exports it whole
/// (`pub use name as other;`).
fn names_crate(code: &str, name: &str) -> bool {
    if code.contains(&format!("use {name} as ")) {
        return true;
    }
    let path = format!("{name}::");
    code.match_indices(&path).any(|(at, _)| {
        code[..at]
            .chars()
            .next_back()
            .is_none_or(|before| !(before.is_alphanumeric() || before == '_'))
    })
}

/// The crates of `section` in the Cargo.toml of `package` (a folder of the workspace, "" for the gateway) that
/// nothing under its `dirs` names.
fn unused(package: &str, section: &str, dirs: &[&str]) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(package)
        .join("Cargo.toml");
    let manifest = fs::read_to_string(manifest).expect("Cargo.toml is readable");
    let crates = crates_of(&manifest, section);
    assert!(
        !crates.is_empty(),
        "[{section}] of {package:?} read as empty"
    );
    let code = code_under(package, dirs);
    crates
        .into_iter()
        .filter(|name| !names_crate(&code, name))
        .collect()
}

#[test]
fn every_dependency_is_used_by_the_library_or_the_binary() {
    for package in ["", "crates/limiter"] {
        let unused = unused(package, "dependencies", &["src"]);
        assert!(
            unused.is_empty(),
            "[dependencies] of {package:?}: nothing under its src/ uses {unused:?}"
        );
    }
}

#[test]
fn every_dev_dependency_is_used_by_a_test_bench_or_example() {
    for package in ["", "crates/limiter"] {
        let unused = unused(
            package,
            "dev-dependencies",
            &["src", "tests", "benches", "examples"],
        );
        assert!(
            unused.is_empty(),
            "[dev-dependencies] of {package:?}: nothing uses {unused:?}"
        );
    }
}

#[test]
fn a_crate_is_named_only_as_the_start_of_a_path() {
    assert!(names_crate("use bytes::Bytes;", "bytes"));
    assert!(names_crate("let x = ::bytes::Bytes::new();", "bytes"));
    assert!(!names_crate("use my_bytes::Bytes;", "bytes"));
    assert!(!names_crate("let bytes = 1;", "bytes"));
}

/// The modules at the top of src/ (a folder or a file, `lib.rs` and `main.rs` aside) and, for each, the others its
/// code names as `crate::other`.
fn module_graph() -> Vec<(String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names: Vec<String> = fs::read_dir(&src)
        .expect("src/ is readable")
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter_map(|path| {
            let name = path.file_stem()?.to_str()?.to_owned();
            (path.is_dir() || path.extension().is_some_and(|ext| ext == "rs")).then_some(name)
        })
        .filter(|name| name != "lib" && name != "main")
        .collect();
    names.sort();
    names.dedup();
    names
        .iter()
        .map(|name| {
            let folder = src.join(name);
            let code = if folder.is_dir() {
                code_under("", &[&format!("src/{name}")])
            } else {
                fs::read_to_string(src.join(format!("{name}.rs"))).expect("a readable module")
            };
            let uses = (names.iter())
                .filter(|other| *other != name && names_crate(&code, &format!("crate::{other}")))
                .cloned()
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// The layers of src/ hold: no two of its modules use each other, directly or through others (a cycle is where
/// a change in one ripples through all of them, and where one concern has started to live in two places).
#[test]
fn no_modules_of_src_use_each_other_in_a_cycle() {
    let graph = module_graph();
    assert!(graph.len() > 5, "src/ read as {graph:?}");
    let uses = |name: &str| {
        graph
            .iter()
            .find(|(module, _)| module == name)
            .map_or(&[][..], |(_, uses)| uses.as_slice())
    };
    // Depth first from every module; a module met again on the current path closes a cycle.
    fn visit<'a>(
        name: &'a str,
        uses: &dyn Fn(&str) -> &'a [String],
        path: &mut Vec<&'a str>,
        done: &mut Vec<&'a str>,
    ) {
        if let Some(at) = path.iter().position(|on| *on == name) {
            panic!(
                "src/ modules in a cycle: {} -> {name}",
                path[at..].join(" -> ")
            );
        }
        if done.contains(&name) {
            return;
        }
        path.push(name);
        for next in uses(name) {
            visit(next, uses, path, done);
        }
        path.pop();
        done.push(name);
    }
    let mut done = Vec::new();
    for (name, _) in &graph {
        visit(name, &uses, &mut Vec::new(), &mut done);
    }
}

/// The connections know nothing of the request path: `server` names no other module of src/ (routes, keys, limits,
/// consumers, the config, admission, the gateway, the rate limit service) nor the limiter crate. Its one seam is
/// the handler it is given. Were anything ever unavoidable it would be proxy's body or tunnel types; neither is
/// needed: the handler wraps the request body itself, and a tunnel's drain hold is a bare `watch` receiver.
#[test]
fn the_server_uses_no_other_module_of_src() {
    let graph = module_graph();
    let (_, uses) = graph
        .iter()
        .find(|(module, _)| module == "server")
        .expect("src/server is a module of src/");
    assert!(uses.is_empty(), "src/server uses {uses:?}");
    let code = code_under("", &["src/server"]);
    for limiter in ["crate::limiter", "tollgate_limiter"] {
        assert!(!names_crate(&code, limiter), "src/server uses {limiter}");
    }
}

/// Admission is below the proxy and the entry points: it names none of them (a WebSocket tunnel's closing, which it
/// waits for, is `tunnel`'s signal, below both). So the proxy's client is the gateway's alone, and a library build
/// of the layer compiles none of it.
#[test]
fn admission_uses_neither_the_proxy_nor_an_entry_point() {
    let graph = module_graph();
    let (_, uses) = graph
        .iter()
        .find(|(module, _)| module == "admission")
        .expect("src/admission is a module of src/");
    for above in ["proxy", "gateway", "layer", "rls", "admin", "server"] {
        assert!(
            !uses.iter().any(|module| module == above),
            "src/admission uses {above}"
        );
    }
}

/// The crates a build of the gateway package with `features` compiles for this host, as `cargo tree` lists them
/// (normal and build dependencies, each once, the package itself included). Offline: the lockfile and the
/// registry's copy are local.
fn crates_in_build(features: &str) -> Vec<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "--package",
            "tollgate",
            "--no-default-features",
        ])
        .args([
            "--features",
            features,
            "--edges",
            "normal,build",
            "--prefix",
            "none",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut crates: Vec<String> = String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .map(|line| line.replace(" (*)", "").replace(" (proc-macro)", ""))
        .filter(|line| !line.is_empty())
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

/// Most crates a library user of the tower layer on Redis compiles (docs/library.md gives the command and the
/// figure): the layer does not bring the gateway's server, proxy client, command line, gRPC, JWT or YAML parsers
/// along.
const LAYER_AND_REDIS_AT_MOST: usize = 151;

#[test]
fn the_layer_on_redis_builds_without_the_gateway_s_crates() {
    let crates = crates_in_build("layer,redis");
    assert!(
        crates.len() <= LAYER_AND_REDIS_AT_MOST,
        "features layer,redis compile {} crates, more than {LAYER_AND_REDIS_AT_MOST}:\n{}",
        crates.len(),
        crates.join("\n")
    );
    let named = |name: &str| {
        crates
            .iter()
            .any(|line| line.split(' ').next() == Some(name))
    };
    for absent in [
        "tonic",
        "tonic-health",
        "envoy-types",
        "clap",
        "jsonwebtoken",
        "mimalloc",
        "rlimit",
        "tracing-subscriber",
        "metrics-exporter-prometheus",
        // The proxy's client and HTTP/2 are the gateway's: the layer is served by the program's own server.
        "h2",
        // Reading config files is the `yaml` feature's: settings built in code need no parser.
        "serde_norway",
        "yaml-rust2",
        "serde_path_to_error",
    ] {
        assert!(!named(absent), "features layer,redis compile {absent}");
    }
    assert!(
        named("fred"),
        "features layer,redis compile no Redis client"
    );
}
