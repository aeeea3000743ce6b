//! The `tollgate` binary as a process: it binds port 0, and the addresses it bound are read from its log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::Process;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A running `tollgate`, killed when dropped. Its config says `listen: 127.0.0.1:0` and `admin.listen:
/// 127.0.0.1:0`: the system picks both ports as the process binds them, and the process names them in its
/// "tollgate listening" log line, so no port is chosen by the test and then taken by another one.
pub struct Tollgate {
    pub process: Process,
    /// The address the gateway bound (its HTTPS listener's when it has no clear-text one).
    pub listen: SocketAddr,
    /// The address the HTTPS listener bound, when the config has `tls:`.
    pub tls: Option<SocketAddr>,
    /// The address the admin listener bound.
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Tollgate {
    /// `tollgate run --config CONFIG` without `TOLLGATE_CONFIG` from the environment, ready for more arguments
    /// and environment before [`Tollgate::spawn`].
    pub fn command(config: &Path) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(["run", "--config"])
            .arg(config)
            .env_remove("TOLLGATE_CONFIG");
        command
    }

    /// Runs `tollgate run --config CONFIG` (see [`Tollgate::spawn`]).
    pub fn run(config: &Path) -> Self {
        Self::spawn(Self::command(config))
    }

    /// Starts `command` (the binary, or a wrapper such as `prlimit` running it), reads its stderr into
    /// [`Tollgate::log`], and waits at most 20 s for the line naming the addresses bound; panics with the log if
    /// the process exits or says nothing of the kind. The line is logged at info: a `RUST_LOG` the command or the
    /// environment sets is widened with `tollgate=info` unless it enables info already.
    pub fn spawn(mut command: Command) -> Self {
        let set = command
            .get_envs()
            .find(|(name, _)| *name == "RUST_LOG")
            .map(|(_, value)| value.map(|v| v.to_string_lossy().into_owned()));
        // Set on the command, removed from it (the binary's default, info), or inherited.
        if let Some(filter) = set.unwrap_or_else(|| std::env::var("RUST_LOG").ok()) {
            command.env("RUST_LOG", with_info_for_tollgate(&filter));
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate");
        let stderr = child.stderr.take().expect("stderr");
        let process = Process(child);
        let log = Arc::new(Mutex::new(String::new()));
        let (bound, addresses) = mpsc::channel();
        let written = Arc::clone(&log);
        std::thread::spawn(move || {
            // Read on to the end: a closed pipe would make the gateway's next log line fail.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let line = without_colours(&line);
                {
                    let mut log = written.lock().expect("log");
                    log.push_str(&line);
                    log.push('\n');
                }
                if line.contains("tollgate listening") {
                    let _ = bound.send(listening(&line));
                }
            }
        });
        let (listen, admin, tls) = match addresses.recv_timeout(Duration::from_secs(20)) {
            Ok(Some(addresses)) => addresses,
            outcome => panic!(
                "tollgate did not name the addresses it listens on ({outcome:?}):\n{}",
                log.lock().expect("log")
            ),
        };
        Self {
            process,
            listen,
            tls,
            admin,
            log,
        }
    }

    /// `http://LISTEN` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }

    /// `http://ADMIN` + `path`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// Everything logged so far (stderr), one line per line, without colours.
    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// The process id, for signals.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }
}

/// `filter` (a `RUST_LOG`) with `tollgate=info` added, unless it enables info (or more) for every target or for
/// tollgate's (`RUST_LOG=debug` must stay debug).
fn with_info_for_tollgate(filter: &str) -> String {
    let enables = filter.split(',').map(str::trim).any(|directive| {
        let level = directive.strip_prefix("tollgate=").unwrap_or(directive);
        matches!(level, "info" | "debug" | "trace")
    });
    if enables {
        filter.to_owned()
    } else {
        format!("{filter},tollgate=info")
    }
}

/// The `listen`, `admin` and `tls` fields of the "tollgate listening" line, in the pretty (`listen=ADDR`) or the
/// JSON (`"listen":"ADDR"`) format; `listen` is `tls`'s address when the gateway serves HTTPS alone.
fn listening(line: &str) -> Option<(SocketAddr, SocketAddr, Option<SocketAddr>)> {
    let field = |name: &str| {
        [format!("{name}="), format!("\"{name}\":\"")]
            .iter()
            .find_map(|prefix| {
                let start = line.find(prefix.as_str())? + prefix.len();
                let value = line[start..].split([' ', '"', ',']).next()?;
                value.parse().ok()
            })
    };
    let tls = field("tls");
    Some((field("listen").or(tls)?, field("admin")?, tls))
}

/// `line` without ANSI escape sequences (the pretty format colours field names).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then a final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
