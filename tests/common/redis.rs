//! A real `redis-server` on a free loopback port, killed when dropped.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{eventually_blocking, ReservedPort};

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    process: RedisProcess,
    /// `redis-cli` arguments that authenticate as an administrator (empty without a password).
    cli_auth: Vec<String>,
    /// The server arguments given after the defaults, for [`RedisServer::restart`].
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts `redis-server` on a free port with persistence off, and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[], &[])
    }

    /// Starts `redis-server` on `port`, reserved by the test before (e.g. to give clients an address where Redis
    /// is not yet): the reservation is handed over and held as long as the server.
    pub fn start_on(port: ReservedPort) -> Self {
        let args = server_args(port.port, &[]);
        let process =
            RedisProcess::start_on(port, &[], &args).unwrap_or_else(|failure| panic!("{failure}"));
        Self::from_process(process, &[], &[])
    }

    /// Starts `redis-server` whose default user needs `password` (`requirepass`); [`RedisServer::cli`] then
    /// authenticates with it.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(
            &["--requirepass", password],
            &["-a", password, "--no-auth-warning"],
        )
    }

    /// Starts `redis-server` on a free port with `extra` server arguments (after the defaults, so they may
    /// override them); `cli_auth` are the `redis-cli` arguments [`RedisServer::cli`] needs to be let in.
    pub fn start_with(extra: &[&str], cli_auth: &[&str]) -> Self {
        let cli_auth: Vec<String> = cli_auth.iter().map(|a| (*a).to_owned()).collect();
        let process = spawn_redis(&cli_auth, |port| server_args(port, extra));
        Self::from_process(process, extra, &cli_auth)
    }

    fn from_process(process: RedisProcess, extra: &[&str], cli_auth: &[String]) -> Self {
        Self {
            port: process.port(),
            process,
            cli_auth: cli_auth.to_vec(),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// Kills the server and starts an empty one on the same port with the same arguments (a restart without
    /// persistence, or a replacement: its keys and its script cache are gone); waits until it answers PING.
    pub fn restart(&mut self) {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let args = server_args(self.port, &extra);
        self.process
            .restart(&self.cli_auth, &args)
            .unwrap_or_else(|failure| panic!("{failure}"));
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
            .args([signal, &self.process.child.id().to_string()])
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
        self.process.kill();
    }
}

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

/// How many fresh ports [`spawn_redis`] tries when redis-server cannot listen on one.
const START_ATTEMPTS: usize = 5;

/// A `redis-server` process on a port this test holds ([`ReservedPort`]), killed when dropped.
pub struct RedisProcess {
    port: ReservedPort,
    child: Child,
    /// Reads what the server writes (its log) to the end, and returns it: the reason it did not start.
    output: Option<JoinHandle<String>>,
}

/// Why a `redis-server` did not come up.
#[derive(Debug)]
pub enum StartFailure {
    /// It could not listen on its port: taken by something outside the tests' reservations.
    PortTaken(String),
    /// Anything else: it exited, or did not answer in time. With its output.
    Other(String),
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PortTaken(output) => write!(f, "redis-server: port taken:\n{output}"),
            Self::Other(output) => write!(f, "redis-server did not start:\n{output}"),
        }
    }
}

impl RedisProcess {
    /// Starts `redis-server ARGS` (which must make it listen on `port`) and waits until the server answering PING
    /// there is this process; `cli_auth` lets `redis-cli` in.
    pub fn start_on(
        port: ReservedPort,
        cli_auth: &[String],
        args: &[String],
    ) -> Result<Self, StartFailure> {
        let (child, output) = spawn_server(args);
        let mut process = Self {
            port,
            child,
            output,
        };
        process.wait_until_up(cli_auth)?;
        Ok(process)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port.port
    }

    /// Kills the server and starts `redis-server ARGS` on the same port, which this test kept holding.
    pub fn restart(&mut self, cli_auth: &[String], args: &[String]) -> Result<(), StartFailure> {
        self.kill();
        (self.child, self.output) = spawn_server(args);
        self.wait_until_up(cli_auth)
    }

    /// Stops the server (SIGKILL) now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Up when `INFO server` on the port names this process: a server that could not listen exits, and another
    /// one answering on the port must not be taken for it.
    fn wait_until_up(&mut self, cli_auth: &[String]) -> Result<(), StartFailure> {
        let pid = format!("process_id:{}", self.child.id());
        let mut exited = false;
        let up = eventually_blocking(Duration::from_secs(10), || {
            exited = matches!(self.child.try_wait(), Ok(Some(_)));
            exited
                || redis_cli(self.port(), cli_auth, &["INFO", "server"])
                    .is_some_and(|info| info.lines().any(|line| line.trim() == pid))
        });
        if up.is_some() && !exited {
            return Ok(());
        }
        self.kill();
        let output = self
            .output
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        Err(if output.contains("Address already in use") {
            StartFailure::PortTaken(output)
        } else {
            StartFailure::Other(output)
        })
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `redis-server ARGS` with its output (the log) read to the end by a thread that returns it.
fn spawn_server(args: &[String]) -> (Child, Option<JoinHandle<String>>) {
    let mut child = Command::new("redis-server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (the README's test command installs it)");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        // Read to the end, whatever the server writes: a full pipe would block it.
        let mut output = Vec::new();
        let _ = stdout.read_to_end(&mut output);
        String::from_utf8_lossy(&output).into_owned()
    });
    (child, Some(reader))
}

/// The one way the helpers start a `redis-server` (single, sentinel set, cluster nodes): with the arguments
/// `args_for` gives for a reserved port; if the server cannot listen there (a port taken by something that does
/// not reserve its ports), again on a fresh one. `cli_auth` lets `redis-cli` in.
pub fn spawn_redis(cli_auth: &[String], args_for: impl Fn(u16) -> Vec<String>) -> RedisProcess {
    let mut taken = Vec::new();
    for _ in 0..START_ATTEMPTS {
        let port = ReservedPort::new();
        let args = args_for(port.port);
        match RedisProcess::start_on(port, cli_auth, &args) {
            Ok(process) => return process,
            Err(StartFailure::PortTaken(output)) => taken.push(output),
            Err(failure) => panic!("{failure}"),
        }
    }
    panic!(
        "redis-server found its port taken {START_ATTEMPTS} times:\n{}",
        taken.join("\n---\n")
    );
}

/// The arguments of a plain server on `port` with persistence off, then `extra` (which may override them).
pub fn server_args(port: u16, extra: &[&str]) -> Vec<String> {
    [
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
    ]
    .iter()
    .chain(extra)
    .map(|a| (*a).to_owned())
    .collect()
}

/// Writes `keys` keys of 1 KiB each into the Redis on `port` at once (one pipelined write): a Redis with a small
/// `maxmemory` under an `allkeys-*` policy evicts to make room.
pub fn flood(port: u16, keys: usize, tag: &str) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to redis");
    let value = "x".repeat(1024);
    let mut commands = String::new();
    for i in 0..keys {
        let key = format!("flood:{tag}:{i}");
        commands.push_str(&format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
            key.len(),
            value.len()
        ));
    }
    stream.write_all(commands.as_bytes()).expect("flood");
    // Every reply read (one line each), so the flood is over when this returns.
    let (mut replies, mut buffer) = (0, [0u8; 65536]);
    while replies < keys {
        let read = stream.read(&mut buffer).expect("replies");
        assert!(read > 0, "redis closed the connection");
        replies += buffer[..read].iter().filter(|&&b| b == b'\n').count();
    }
}
