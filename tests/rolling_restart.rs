//! Rolling restarts behind a real haproxy: two gateways, health checks on readiness, no retries, steady load; one
//! gateway is sent SIGTERM and replaced by a new one, then the other: no request fails, and each gateway serves
//! nothing once it has gone.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::upstream::Upstream;
use common::{eventually, Process, ReservedPort};

/// The header haproxy adds to each answer, naming the server (gateway) that served it.
const SERVED_BY: &str = "x-served-by";
/// The header haproxy adds to each answer, with the local port of its connection to that server: one port seen
/// on several answers is one connection reused.
const CONNECTION_PORT: &str = "x-connection-port";

/// How haproxy asks a gateway whether it is ready.
#[derive(Clone, Copy)]
enum Check {
    /// `/readyz` on the admin listener (`check port ADMIN`).
    AdminReadyz,
    /// `server.health_path` on the listener haproxy balances to.
    HealthPath,
}

/// How connections are kept, client to haproxy and haproxy to the gateways.
#[derive(Clone, Copy, PartialEq)]
enum Connections {
    /// A new connection for every request, on both sides.
    New,
    /// Clients keep theirs to haproxy, and haproxy reuses its idle connections to the gateways for any request.
    Reused,
    /// As `Reused`, with haproxy speaking HTTP/2 to the gateways (h2c, `proto h2`): many requests on one connection
    /// at once, and GOAWAY when a gateway's listener closes.
    Http2,
}

#[tokio::test]
async fn a_rolling_restart_behind_haproxy_fails_no_request() {
    rolling_restart(Check::AdminReadyz, Connections::New).await;
}

#[tokio::test]
async fn keep_alive_connections_through_haproxy_fail_no_request_across_a_rolling_restart() {
    rolling_restart(Check::HealthPath, Connections::Reused).await;
}

#[tokio::test]
async fn http2_from_haproxy_to_the_gateways_fails_no_request_across_a_rolling_restart() {
    rolling_restart(Check::HealthPath, Connections::Http2).await;
}

/// Two gateways (`a`, `b`) behind haproxy under steady load from four clients, and a third server line (`c`) on
/// reserved ports where nothing listens yet: the new instance. `a` is sent SIGTERM mid-load; once it has exited,
/// `c` starts, and once haproxy sends to it, `b` is sent SIGTERM. Every request must succeed, before, during and
/// after each drain, and no gateway may serve a request started after it exited.
async fn rolling_restart(check: Check, connections: Connections) {
    let Some(haproxy) = haproxy_binary() else {
        eprintln!(
            "SKIPPED: no haproxy binary in PATH, /usr/sbin or /usr/local/sbin (scripts/test.sh installs the Debian \
             package haproxy)"
        );
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut a = gateway(&dir, "a", &upstream, None);
    let mut b = gateway(&dir, "b", &upstream, None);
    // The new instance's ports are held until it binds them (a bound socket that does not listen: connections are
    // refused, and no other test takes them).
    let (c_listen, c_admin) = (ReservedPort::new(), ReservedPort::new());
    let servers = [
        Server::of("a", &a),
        Server::of("b", &b),
        Server {
            name: "c",
            listen: c_listen.addr(),
            admin: c_admin.addr(),
        },
    ];
    let balancer = Haproxy::start(&haproxy, &dir, &servers, check, connections);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(match connections {
            Connections::New => 0,
            Connections::Reused | Connections::Http2 => 16,
        })
        .build()
        .expect("client");
    let url = format!("http://{}/api/rolling", balancer.addr());
    // Before the load: haproxy has found c down, and sends to both a and b.
    let c_down = eventually(Duration::from_secs(20), async || {
        balancer.log().contains("gateways/c is DOWN")
    })
    .await;
    assert!(c_down.is_some(), "c never marked down:\n{}", balancer.log());
    let mut seen = Vec::new();
    let both = eventually(Duration::from_secs(20), async || {
        if let Ok(served) = served_by(&client, &url).await {
            if !seen.contains(&served.server) {
                seen.push(served.server);
            }
        }
        seen.len() == 2
    })
    .await;
    assert!(
        both.is_some(),
        "haproxy never sent to both gateways (saw {seen:?}):\n{}",
        balancer.log()
    );

    let load = Load::start(&client, &url, 4);
    let warmed = eventually(Duration::from_secs(20), async || load.served() >= 40).await;
    assert!(warmed.is_some(), "no steady load through haproxy");

    // a goes, c comes.
    let a_signalled = Instant::now();
    let a_gone = drained(&mut a).await;
    let c = gateway(
        &dir,
        "c",
        &upstream,
        Some((c_listen.addr(), c_admin.addr())),
    );
    let c_serves = eventually(Duration::from_secs(20), async || {
        load.served_by_since("c", a_gone) >= 20
    })
    .await;
    assert!(
        c_serves.is_some(),
        "haproxy never sent to c:\n{}",
        balancer.log()
    );

    // Then b goes; the load goes on through its exit and a while after, on c alone.
    let b_signalled = Instant::now();
    let b_gone = drained(&mut b).await;
    let after = eventually(Duration::from_secs(30), async || {
        load.served_since(b_gone) >= 100
    })
    .await;
    let outcomes = load.stop().await;
    assert!(after.is_some(), "the load stalled after b exited");

    let failed: Vec<_> = outcomes.iter().filter(|o| o.served_by.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed, the first: {:?}\n--- haproxy:\n{}\n--- a:\n{}\n--- b:\n{}",
        failed.len(),
        outcomes.len(),
        failed.first().map(|o| &o.served_by),
        balancer.log(),
        a.log(),
        b.log()
    );
    let by = |server: &str, when: &dyn Fn(Instant) -> bool| {
        outcomes
            .iter()
            .filter(|o| when(o.started) && o.server() == Some(server))
            .count()
    };
    assert!(
        by("a", &|started| started < a_signalled) > 0,
        "a served nothing before its signal"
    );
    assert_eq!(
        by("a", &|started| started > a_gone),
        0,
        "a served requests after it exited"
    );
    assert_eq!(
        by("b", &|started| started > b_gone),
        0,
        "b served requests after it exited"
    );
    assert!(
        by("c", &|started| started > b_gone) >= 100,
        "c took over the load"
    );
    if connections != Connections::New {
        // haproxy's connections were reused: to a while it drained, and to b across a's exit and c's start.
        let ports = |server: &str, when: &dyn Fn(Instant) -> bool| {
            outcomes
                .iter()
                .filter_map(|o| o.served_by.as_ref().ok().filter(|_| when(o.started)))
                .filter(|s| s.server == server)
                .map(|s| s.port)
                .collect::<std::collections::HashSet<u16>>()
        };
        assert!(
            ports("a", &|_| true).len() < by("a", &|_| true),
            "no connection to a served two requests"
        );
        let before = ports("b", &|started| started < a_signalled);
        let after = ports("b", &|started| started > a_gone && started < b_signalled);
        assert!(
            before.intersection(&after).next().is_some(),
            "no connection to b served requests both before a's signal and after a exited ({before:?}, {after:?})"
        );
    }
    let via = match connections {
        Connections::Http2 => "2 tollgate",
        Connections::New | Connections::Reused => "1.1 tollgate",
    };
    let other = outcomes
        .iter()
        .filter_map(|o| o.served_by.as_ref().ok())
        .find(|s| s.via != via);
    assert!(other.is_none(), "not over {via}: {other:?}");
    for (name, gateway) in [("a", &a), ("b", &b)] {
        let log = gateway.log();
        assert!(
            log.contains("drained: every connection finished"),
            "{name} cut connections at the end of its drain:\n{log}"
        );
    }
    drop(c);
}

/// Sends SIGTERM to `gateway` and waits for it to exit 0; when it was seen gone.
async fn drained(gateway: &mut Tollgate) -> Instant {
    kill("-TERM", gateway);
    let mut status = None;
    let exited = eventually(Duration::from_secs(60), async || {
        status = gateway.process.0.try_wait().expect("wait");
        status.is_some()
    })
    .await;
    let gone = Instant::now();
    assert!(exited.is_some(), "a gateway did not exit after SIGTERM");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "exit status");
    gone
}

/// One server line of haproxy's backend: a gateway's name, the address balanced to and its admin listener.
struct Server {
    name: &'static str,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Server {
    fn of(name: &'static str, gateway: &Tollgate) -> Self {
        Self {
            name,
            listen: gateway.listen,
            admin: gateway.admin,
        }
    }
}

/// A gateway process proxying `/api` to `upstream`, with the `server` settings docs/operations.md gives next to its
/// haproxy configuration (`/health` as `server.health_path`, a drain long enough for haproxy's checks to see it).
/// The listener and admin addresses are the system's choice, or `addresses`.
fn gateway(
    dir: &tempfile::TempDir,
    name: &str,
    upstream: &Upstream,
    addresses: Option<(SocketAddr, SocketAddr)>,
) -> Tollgate {
    let path = dir.path().join(format!("{name}.yaml"));
    let (listen, admin) = addresses.map_or_else(
        || ("127.0.0.1:0".to_owned(), "127.0.0.1:0".to_owned()),
        |(listen, admin)| (listen.to_string(), admin.to_string()),
    );
    let yaml = format!(
        r#"listen: {listen}
admin:
  listen: {admin}
store:
  backend: memory
{server}upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
"#,
        server = documented().1,
        upstream = upstream.url()
    );
    std::fs::write(&path, yaml).expect("write config");
    let mut command = Tollgate::command(&path);
    command.env("RUST_LOG", "warn");
    Tollgate::spawn(command)
}

/// The haproxy configuration and the gateways' `server` block that docs/operations.md shows under "### haproxy":
/// the first two fenced blocks there. The tests run them, so that the page shows what is proven.
fn documented() -> (String, String) {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("read docs/operations.md");
    let section = &page[page.find("\n### haproxy\n").expect("a haproxy section")..];
    let mut blocks = section.split("```").skip(1).step_by(2).map(|block| {
        // Past the fence's info string (`yaml`), to the block's first line.
        block.split_once('\n').expect("a fenced block").1.to_owned()
    });
    let haproxy = blocks.next().expect("the haproxy configuration");
    let server = blocks.next().expect("the gateways' server block");
    assert!(
        server.starts_with("server:\n"),
        "not a server block:\n{server}"
    );
    (haproxy, server)
}

/// `text` with `from` (which it must contain) replaced by `to`.
fn swap(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in:\n{text}");
    text.replacen(from, to, 1)
}

fn kill(signal: &str, process: &Tollgate) {
    let status = Command::new("kill")
        .args([signal, &process.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// The gateway named by haproxy that served `url`, or why the request failed.
async fn served_by(client: &reqwest::Client, url: &str) -> Result<Served, String> {
    let response = client.get(url).send().await.map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let server = response
        .headers()
        .get(SERVED_BY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let port = response
        .headers()
        .get(CONNECTION_PORT)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let body = response.text().await.map_err(|e| format!("body: {e:?}"))?;
    if status != 200 {
        return Err(format!("{status} from {server}: {body}"));
    }
    // The upstream echoes the request it received: its `Via` names the protocol haproxy spoke to the gateway.
    let echoed: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    let via = echoed["headers"]["via"].as_str().unwrap_or("-").to_owned();
    Ok(Served { server, port, via })
}

/// Which gateway served a request, on which of haproxy's connections to it, and over which protocol (the `Via`
/// the gateway wrote: `1.1 tollgate` or `2 tollgate`).
#[derive(Debug, Clone, PartialEq)]
struct Served {
    server: String,
    port: u16,
    via: String,
}

/// One request of the load.
#[derive(Debug)]
struct Outcome {
    started: Instant,
    served_by: Result<Served, String>,
}

impl Outcome {
    fn server(&self) -> Option<&str> {
        self.served_by.as_ref().ok().map(|s| s.server.as_str())
    }
}

/// Clients sending requests one after another each, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &reqwest::Client, url: &str, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|_| {
                let (client, url) = (client.clone(), url.to_owned());
                let (stop, outcomes) = (stop.clone(), outcomes.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let served_by = served_by(&client, &url).await;
                        outcomes
                            .lock()
                            .expect("outcomes")
                            .push(Outcome { started, served_by });
                    }
                })
            })
            .collect();
        Self {
            stop,
            outcomes,
            tasks,
        }
    }

    /// Requests answered so far.
    fn served(&self) -> usize {
        self.outcomes.lock().expect("outcomes").len()
    }

    /// Requests started after `since` and answered by `server` so far.
    fn served_by_since(&self, server: &str, since: Instant) -> usize {
        let outcomes = self.outcomes.lock().expect("outcomes");
        outcomes
            .iter()
            .filter(|o| o.started > since && o.server() == Some(server))
            .count()
    }

    /// Requests started after `since` and answered so far.
    fn served_since(&self, since: Instant) -> usize {
        let outcomes = self.outcomes.lock().expect("outcomes");
        outcomes.iter().filter(|o| o.started > since).count()
    }

    /// Stops the clients once their requests in flight are answered; every outcome.
    async fn stop(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("load task");
        }
        std::mem::take(&mut *self.outcomes.lock().expect("outcomes"))
    }
}

/// The haproxy binary: in `PATH`, or in the sbin directories a non-root `PATH` may lack.
fn haproxy_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("haproxy"))
        .find(|candidate| candidate.is_file())
}

/// haproxy in the foreground on a reserved loopback port, balancing to gateways; killed when dropped.
struct Haproxy {
    _process: Process,
    port: ReservedPort,
    log: Arc<Mutex<String>>,
}

impl Haproxy {
    /// Writes the config to `dir` and starts haproxy; returns once its frontend accepts connections.
    fn start(
        binary: &Path,
        dir: &tempfile::TempDir,
        servers: &[Server],
        check: Check,
        connections: Connections,
    ) -> Self {
        let port = ReservedPort::new();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config(port.port, servers, check, connections))
            .expect("write haproxy.cfg");
        let mut child = Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn haproxy");
        let log = Arc::new(Mutex::new(String::new()));
        for output in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(output).lines().map_while(Result::ok) {
                    let mut log = log.lock().expect("log");
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let mut process = Process(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(port.addr()).is_err() {
            let exited = process.0.try_wait().expect("wait haproxy");
            assert!(
                exited.is_none() && started.elapsed() < Duration::from_secs(20),
                "haproxy did not start ({exited:?}):\n{}",
                log.lock().expect("log")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            _process: process,
            port,
            log,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.port.addr()
    }

    /// What haproxy logged so far (its access log and server state changes).
    fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }
}

/// The documented haproxy configuration, on `port` and `servers` (the documented lines replaced by one per
/// server): each gateway a server checked every 200 ms (down after two failed checks, so that one slow check on a
/// loaded machine is not enough; up after two good ones), no retries and no redispatch, so that any request sent to
/// a gateway that cannot serve it fails. `check` and `connections` make the documented variant (the admin
/// listener's `/readyz`, a new connection per request); the log and two answer headers are the test's own.
fn config(port: u16, servers: &[Server], check: Check, connections: Connections) -> String {
    let mut config = swap(
        &documented().0,
        "    bind :80\n",
        &format!("    bind 127.0.0.1:{port}\n"),
    );
    config.truncate(config.find("    server a ").expect("server lines"));
    for server in servers {
        let port = match check {
            Check::AdminReadyz => format!(" port {}", server.admin.port()),
            Check::HealthPath => String::new(),
        };
        let proto = match connections {
            Connections::Http2 => " proto h2",
            Connections::New | Connections::Reused => "",
        };
        config.push_str(&format!(
            "    server {} {}{port}{proto}\n",
            server.name, server.listen
        ));
    }
    if let Check::AdminReadyz = check {
        config = swap(
            &config,
            "option httpchk GET /health\n",
            "option httpchk GET /readyz\n",
        );
    }
    if connections == Connections::New {
        config = swap(&config, "    http-reuse always\n", "    option httpclose\n");
    }
    config = swap(
        &config,
        "defaults\n",
        "global\n    log stderr format raw local0 info\n\ndefaults\n    log global\n    option httplog\n",
    );
    config.push_str(&format!(
        "    http-response set-header {SERVED_BY} %s\n    http-response set-header {CONNECTION_PORT} %[bc_src_port]\n"
    ));
    config
}
