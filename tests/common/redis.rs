//! A real `redis-server` on a free loopback port, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    /// `redis-cli` arguments that authenticate as an administrator (empty without a password).
    cli_auth: Vec<String>,
    /// The server arguments given after the defaults, for [`RedisServer::restart`].
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts `redis-server` on a free port with persistence off, and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts `redis-server` on `port` (to restart one on the same port).
    pub fn start_on(port: u16) -> Self {
        Self::start_with(port, &[], &[])
    }

    /// Starts `redis-server` whose default user needs `password` (`requirepass`); [`RedisServer::cli`] then
    /// authenticates with it.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(
            free_port(),
            &["--requirepass", password],
            &["-a", password, "--no-auth-warning"],
        )
    }

    /// Starts `redis-server` on `port` with `extra` server arguments (after the defaults, so they may override
    /// them); `cli_auth` are the `redis-cli` arguments [`RedisServer::cli`] needs to be let in.
    pub fn start_with(port: u16, extra: &[&str], cli_auth: &[&str]) -> Self {
        let mut server = Self {
            port,
            child: Self::spawn(port, extra),
            cli_auth: cli_auth.iter().map(|a| (*a).to_owned()).collect(),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.wait_until_up();
        server
    }

    /// Kills the server and starts an empty one on the same port with the same arguments (a restart without
    /// persistence, or a replacement: its keys and its script cache are gone); waits until it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = Self::spawn(self.port, &extra);
        self.wait_until_up();
    }

    /// Sets the default user's password at runtime (`CONFIG SET requirepass`); connections already logged in
    /// stay so, new ones need it. [`RedisServer::cli`] uses it from now on.
    pub fn set_password(&mut self, password: &str) {
        assert_eq!(
            self.cli(&["CONFIG", "SET", "requirepass", password])
                .as_deref(),
            Some("OK")
        );
        self.cli_auth = vec![
            "-a".to_owned(),
            password.to_owned(),
            "--no-auth-warning".to_owned(),
        ];
    }

    fn spawn(port: u16, extra: &[&str]) -> Child {
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)")
    }

    fn wait_until_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server; the trimmed output, or `None` if it failed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        redis_cli(self.port, &self.cli_auth, args)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// A counter of `INFO commandstats` (e.g. `evalsha`): how many times Redis ran that command.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Stops the server (SIGKILL) now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How many times to start a server on fresh ports when the free ports picked were taken meanwhile.
const START_ATTEMPTS: usize = 5;

/// Runs `redis-cli` against 127.0.0.1:`port`, with `auth` (e.g. `--user u --pass p`) before `args`; the trimmed
/// output, or `None` if it failed.
pub fn redis_cli(port: u16, auth: &[String], args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(auth)
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Starts `redis-server` with the arguments `args_for` gives for a free port, retrying on a fresh port if it
/// cannot bind, and waits until it answers PING. For the cluster and sentinel helpers.
pub fn spawn_redis(args_for: impl Fn(u16) -> Vec<String>) -> (u16, Child) {
    for _ in 0..START_ATTEMPTS {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(args_for(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if redis_cli(port, &[], &["PING"]).as_deref() == Some("PONG") {
                return (port, child);
            }
            if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("could not start redis-server in {START_ATTEMPTS} attempts");
}
