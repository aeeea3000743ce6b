//! The container setup holds together without a Docker engine: compose file, Dockerfile, mounted config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

/// The config path inside the image, where the Dockerfile's CMD and the compose mount agree to put it.
const CONFIG_IN_IMAGE: &str = "/etc/tollgate/gateway.yaml";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(name: &str) -> String {
    std::fs::read_to_string(repo().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn compose() -> Value {
    serde_yaml::from_str(&read("docker-compose.yml")).expect("docker-compose.yml is YAML")
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose
        .get("services")
        .and_then(|s| s.get(name))
        .unwrap_or_else(|| panic!("docker-compose.yml has no service {name:?}"))
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A service's `environment:`, map or list form, with compose's `${VAR:-default}` resolved to the default (as
/// `docker compose up` does when the variable is unset).
fn environment(service: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    match service.get("environment") {
        Some(Value::Mapping(map)) => {
            for (name, value) in map {
                let value = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => String::new(),
                };
                env.insert(name.as_str().unwrap_or_default().to_owned(), value);
            }
        }
        Some(Value::Sequence(items)) => {
            for item in items.iter().filter_map(Value::as_str) {
                let (name, value) = item.split_once('=').unwrap_or((item, ""));
                env.insert(name.to_owned(), value.to_owned());
            }
        }
        _ => {}
    }
    env.into_iter()
        .map(|(name, value)| (name, compose_default(&value)))
        .collect()
}

/// `${VAR:-default}` → `default`; other text unchanged.
fn compose_default(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let inner = &rest[start + 2..start + end];
        out.push_str(inner.split_once(":-").map_or("", |(_, default)| default));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The host and port of `scheme://host:port`.
fn host_port(url: &str) -> (String, u16) {
    let uri: http::Uri = url
        .parse()
        .unwrap_or_else(|e| panic!("{url:?} is not a URL: {e}"));
    let authority = uri.authority().expect("URL with a host");
    (
        authority.host().to_owned(),
        authority.port_u16().expect("URL with a port"),
    )
}

#[test]
fn compose_runs_redis_an_upstream_and_tollgate_built_here() {
    let compose = compose();
    let redis = service(&compose, "redis");
    assert!(
        redis
            .get("image")
            .and_then(Value::as_str)
            .is_some_and(|image| image.starts_with("redis:7")),
        "redis runs redis:7"
    );
    let upstream = service(&compose, "upstream");
    assert!(upstream.get("image").and_then(Value::as_str).is_some());

    let tollgate = service(&compose, "tollgate");
    let build = tollgate.get("build").expect("tollgate is built");
    let context = repo().join(
        build
            .get("context")
            .and_then(Value::as_str)
            .expect("build.context"),
    );
    assert!(context.is_dir(), "build context {context:?}");
    let dockerfile = build
        .get("dockerfile")
        .and_then(Value::as_str)
        .unwrap_or("Dockerfile");
    assert!(
        context.join(dockerfile).is_file(),
        "{dockerfile} in {context:?}"
    );
    assert!(context.join("Cargo.toml").is_file());

    let depends: Vec<String> = match tollgate.get("depends_on") {
        Some(Value::Mapping(map)) => map
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect(),
        other => strings(other),
    };
    assert!(depends.contains(&"redis".to_owned()), "{depends:?}");
    assert!(depends.contains(&"upstream".to_owned()), "{depends:?}");
}

#[test]
fn compose_environment_points_at_the_compose_services() {
    let compose = compose();
    let env = environment(service(&compose, "tollgate"));

    let (host, port) = host_port(&env["REDIS_URL"]);
    assert!(env["REDIS_URL"].starts_with("redis://"));
    assert_eq!((host.as_str(), port), ("redis", 6379));
    service(&compose, &host);

    let (host, port) = host_port(&env["UPSTREAM_URL"]);
    assert_eq!((host.as_str(), port), ("upstream", 80));
    service(&compose, &host);

    assert!(
        !env["TOLLGATE_ADMIN_TOKEN"].is_empty(),
        "an admin token is set"
    );
    assert_eq!(env["TOLLGATE_LISTEN"], "0.0.0.0:8080");
}

#[test]
fn compose_mounts_the_repository_config_where_the_image_reads_it() {
    let compose = compose();
    let tollgate = service(&compose, "tollgate");
    let mounts = strings(tollgate.get("volumes"));
    let (source, target) = mounts
        .iter()
        .find_map(|mount| {
            let mut fields = mount.split(':');
            let source = fields.next()?;
            let target = fields.next()?;
            (target == CONFIG_IN_IMAGE).then(|| (source.to_owned(), target.to_owned()))
        })
        .unwrap_or_else(|| panic!("no mount on {CONFIG_IN_IMAGE}: {mounts:?}"));
    assert!(repo().join(&source).is_file(), "mounted {source:?} exists");
    assert_eq!(
        Path::new(&source).file_name(),
        Some("gateway.yaml".as_ref())
    );
    let command = strings(tollgate.get("command"));
    assert_eq!(command, ["--config", target.as_str()]);

    // The gateway published on 8080; the admin port stays unpublished (gateway.yaml binds it to loopback).
    let ports = strings(tollgate.get("ports"));
    assert!(ports.iter().any(|p| p.ends_with(":8080")), "{ports:?}");
    assert!(!ports.iter().any(|p| p.contains("9901")), "{ports:?}");
}

#[test]
fn mounted_config_with_the_compose_environment_is_valid() {
    let compose = compose();
    let env = environment(service(&compose, "tollgate"));
    let text = read("gateway.yaml");
    let config = tollgate::config::parse_with_env(&text, Path::new("gateway.yaml"), |name| {
        env.get(name).cloned()
    })
    .unwrap_or_else(|e| panic!("gateway.yaml with the compose environment:\n{e}"));
    assert_eq!(
        config.listen.map(|l| l.to_string()).as_deref(),
        Some("0.0.0.0:8080")
    );
    assert_eq!(config.store.url, "redis://redis:6379");
    let targets: Vec<String> = config
        .upstreams
        .iter()
        .flat_map(|u| u.targets.iter().map(|t| t.to_string()))
        .collect();
    assert!(
        targets.iter().any(|t| t.starts_with("http://upstream")),
        "{targets:?}"
    );
    let routes: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert!(
        routes.contains(&"demo") && routes.contains(&"api"),
        "{routes:?}"
    );
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped: `(INSTRUCTION, arguments)`.
fn dockerfile() -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (op, args) = current.split_once(' ').unwrap_or((&current, ""));
                instructions.push((op.to_ascii_uppercase(), args.trim().to_owned()));
                current.clear();
            }
        }
    }
    instructions
}

#[test]
fn dockerfile_builds_from_files_that_exist() {
    let instructions = dockerfile();
    let of = |op: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, args)| args.as_str())
            .collect()
    };
    let stages = of("FROM");
    assert_eq!(stages.len(), 2, "{stages:?}");
    assert!(stages[0].starts_with("rust:1-bookworm"), "{stages:?}");
    assert!(stages[0].to_ascii_lowercase().ends_with(" as builder"));
    assert_eq!(stages[1], "debian:bookworm-slim");

    let mut copied = Vec::new();
    for args in of("COPY") {
        if args.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = args.split_whitespace().collect();
        let (_destination, sources) = words.split_last().expect("COPY with sources");
        for source in sources {
            assert!(
                repo().join(source).exists(),
                "COPY {source}: not in the repo"
            );
            copied.push(source.trim_end_matches('/').to_owned());
        }
    }
    for needed in ["Cargo.toml", "Cargo.lock", "src", "gateway.yaml"] {
        assert!(
            copied.iter().any(|c| c == needed),
            "{needed} is copied: {copied:?}"
        );
    }
    let ignored = read(".dockerignore");
    let ignored: Vec<&str> = ignored
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        ignored.iter().any(|l| l.trim_end_matches('/') == "target"),
        "{ignored:?}"
    );
    for source in &copied {
        assert!(
            !ignored.iter().any(|l| l.trim_end_matches('/') == source),
            ".dockerignore drops {source}, which the Dockerfile copies"
        );
    }

    assert!(
        of("RUN")
            .iter()
            .any(|run| run.contains("cargo build --release --locked")),
        "a locked release build"
    );
    let user = of("USER");
    assert!(
        user.last().is_some_and(|u| *u != "root" && *u != "0"),
        "runs as a non-root user: {user:?}"
    );
    assert_eq!(of("EXPOSE"), ["8080 9901"]);
    assert_eq!(of("ENTRYPOINT"), ["[\"tollgate\"]"]);
    assert_eq!(
        of("CMD"),
        [format!("[\"--config\", \"{CONFIG_IN_IMAGE}\"]").as_str()]
    );
}

/// `docker compose` or `docker-compose`, whichever answers `version` here.
fn compose_command() -> Option<Vec<&'static str>> {
    let candidates: [&[&'static str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    candidates.into_iter().find_map(|command| {
        let works = Command::new(command[0])
            .args(&command[1..])
            .arg("version")
            .output()
            .is_ok_and(|out| out.status.success());
        works.then(|| command.to_vec())
    })
}

#[test]
fn docker_compose_config_accepts_the_file() {
    // The one test that depends on the machine: without a compose command there is nothing to ask.
    let Some(command) = compose_command() else {
        eprintln!(
            "note: skipping `docker compose config`: neither `docker compose` nor `docker-compose` works here \
             (the YAML is still checked by the other tests of this file)"
        );
        return;
    };
    let output = Command::new(command[0])
        .args(&command[1..])
        .args(["-f", "docker-compose.yml", "config", "--quiet"])
        .current_dir(repo())
        .output()
        .expect("run compose");
    assert!(
        output.status.success(),
        "{} config failed:\n{}",
        command.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `.dockerignore`'s patterns in file order: `(excluded, components)`; a `!` line re-includes.
fn dockerignore() -> Vec<(bool, Vec<String>)> {
    read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (excluded, pattern) = match line.strip_prefix('!') {
                Some(rest) => (false, rest),
                None => (true, line),
            };
            let components = pattern
                .trim_matches('/')
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .map(str::to_owned)
                .collect();
            (excluded, components)
        })
        .collect()
}

/// One path component against one pattern component: `*` any run of characters, `?` one character.
fn component_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            component_matches(&pattern[1..], name)
                || (!name.is_empty() && component_matches(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => component_matches(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => component_matches(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// A path (components from the context's root) against a pattern, `**` standing for any number of components.
fn path_matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skip| path_matches(rest, &path[skip..]))
        }
        Some((first, rest)) => path.split_first().is_some_and(|(name, tail)| {
            component_matches(first.as_bytes(), name.as_bytes()) && path_matches(rest, tail)
        }),
    }
}

/// Whether Docker leaves `relative` out of the build context: the last matching pattern decides, and a
/// directory left out takes everything under it along.
fn ignored(patterns: &[(bool, Vec<String>)], relative: &Path) -> bool {
    let components: Vec<&str> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    (1..=components.len()).any(|depth| {
        patterns
            .iter()
            .rev()
            .find(|(_, pattern)| path_matches(pattern, &components[..depth]))
            .is_some_and(|(excluded, _)| *excluded)
    })
}

/// Copies `source` (relative to the repository, the build context) to `destination` as `COPY` does: a file as
/// itself, a directory's contents into the destination; what .dockerignore leaves out is not there to copy.
fn copy_from_context(
    patterns: &[(bool, Vec<String>)],
    source: &Path,
    destination: &Path,
) -> std::io::Result<()> {
    assert!(
        !ignored(patterns, source),
        "COPY {source:?}: .dockerignore leaves it out of the build context"
    );
    let from = repo().join(source);
    if from.is_dir() {
        std::fs::create_dir_all(destination)?;
        for entry in std::fs::read_dir(&from)? {
            let entry = entry?;
            let relative = source.join(entry.file_name());
            if ignored(patterns, &relative) {
                continue;
            }
            copy_from_context(patterns, &relative, &destination.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&from, destination).map(drop)
    }
}

#[test]
fn dockerignore_patterns_match_as_docker_reads_them() {
    let patterns = dockerignore();
    assert!(ignored(&patterns, Path::new("target")));
    assert!(ignored(&patterns, Path::new("target/debug/tollgate")));
    assert!(ignored(&patterns, Path::new("fuzz/target/x")));
    assert!(ignored(&patterns, Path::new("a.log")));
    assert!(!ignored(&patterns, Path::new("src/main.rs")));
    assert!(!ignored(&patterns, Path::new("benches/hot_path.rs")));
    assert!(!ignored(&patterns, Path::new("Cargo.toml")));
}

/// The builder stage run here without Docker: a directory laid out exactly as the stage's `WORKDIR` and `COPY`
/// lines say (sources taken from the context that .dockerignore leaves), then each `RUN` step in it with `sh`, in
/// order. The cargo steps run as `cargo check --offline` against the suite's own target directory: the release
/// build's LTO codegen would cost minutes per run, while checking proves what the image build needs of this file:
/// that the manifest finds every target it declares, the lockfile is current (`--locked`) and the sources copied
/// compile. Only the step that copies the release binary out is left out (check writes none). The first run on
/// a machine checks the dependencies once without the dev-dependencies' features, later runs reuse them.
#[test]
fn dockerfile_builder_stage_builds_from_its_copied_context() {
    let instructions = dockerfile();
    let builder: Vec<&(String, String)> = instructions
        .iter()
        .skip_while(|(op, _)| op != "FROM")
        .skip(1)
        .take_while(|(op, _)| op != "FROM")
        .collect();
    let patterns = dockerignore();

    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory holds tmp/")
        .to_owned();
    // A fixed place, so that every run's crate has the same path and so the same artefacts in the target dir.
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docker-builder");
    let _ = std::fs::remove_dir_all(&root);
    let mut workdir = root.clone();
    std::fs::create_dir_all(&workdir).expect("create the stage's root");

    let mut cargo_steps = 0;
    let mut sources_built = false;
    let mut copied_sources = false;
    for (op, args) in builder {
        match op.as_str() {
            "WORKDIR" => {
                workdir = root.join(args.trim_start_matches('/'));
                std::fs::create_dir_all(&workdir).expect("WORKDIR");
            }
            "COPY" => {
                assert!(!args.starts_with("--"), "COPY flags: {args}");
                let words: Vec<&str> = args.split_whitespace().collect();
                let (destination, sources) = words.split_last().expect("COPY with sources");
                let destination = workdir.join(destination);
                let into_directory =
                    destination.to_string_lossy().ends_with('/') || sources.len() > 1;
                for source in sources {
                    let source = Path::new(source.trim_end_matches('/'));
                    let to = if into_directory && !repo().join(source).is_dir() {
                        destination.join(source.file_name().expect("a file name"))
                    } else {
                        destination.clone()
                    };
                    copy_from_context(&patterns, source, &to)
                        .unwrap_or_else(|e| panic!("COPY {source:?}: {e}"));
                    copied_sources |= source == Path::new("src");
                }
            }
            "RUN" => {
                let mut steps = Vec::new();
                for step in args.split("&&").map(str::trim) {
                    if step.contains("target/release/") {
                        continue;
                    }
                    match step.strip_prefix("cargo build --release") {
                        Some(flags) => {
                            cargo_steps += 1;
                            sources_built |= copied_sources;
                            steps.push(format!("\"$TOLLGATE_CARGO\" check --offline{flags}"));
                        }
                        None => steps.push(step.to_owned()),
                    }
                }
                let script = steps.join(" && ");
                let mut sh = Command::new("sh");
                // Without the variables `cargo test` sets for this test (CARGO_MANIFEST_DIR, CARGO_PKG_NAME...):
                // build scripts (ring's, through cc) rerun when those change, and would then rerun in the
                // suite's next build too, with everything that depends on them.
                for (name, _) in std::env::vars_os() {
                    let name = name.to_string_lossy();
                    if (name.starts_with("CARGO") && name != "CARGO_HOME") || name == "OUT_DIR" {
                        sh.env_remove(name.as_ref());
                    }
                }
                let output = sh
                    .args(["-euc", &script])
                    .current_dir(&workdir)
                    .env("TOLLGATE_CARGO", env!("CARGO"))
                    .env("CARGO_TARGET_DIR", &target_dir)
                    .output()
                    .expect("run sh");
                assert!(
                    output.status.success(),
                    "RUN {args}\n(here: {script})\nfailed:\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            _ => {}
        }
    }
    assert_eq!(
        cargo_steps, 2,
        "the dependencies' step and the sources' step"
    );
    assert!(sources_built, "a cargo step runs on the copied src/");
}

#[test]
fn compose_persists_the_consumer_directory_with_the_append_only_file_on_a_volume() {
    let compose = compose();
    let redis = service(&compose, "redis");
    let command = strings(redis.get("command"));
    let setting = |name: &str| {
        command
            .iter()
            .position(|arg| arg == name)
            .and_then(|i| command.get(i + 1))
            .map(String::as_str)
    };
    assert_eq!(setting("--appendonly"), Some("yes"), "{command:?}");
    let mounts = strings(redis.get("volumes"));
    let volume = mounts
        .iter()
        .find_map(|mount| mount.strip_suffix(":/data"))
        .unwrap_or_else(|| panic!("no volume on /data: {mounts:?}"));
    assert!(
        compose
            .get("volumes")
            .and_then(|volumes| volumes.get(volume))
            .is_some(),
        "the named volume {volume:?} is declared"
    );
}
