#!/usr/bin/env python3
"""What a runtime consumer directory of many consumers costs on Redis: memory per consumer, a restart with its
readiness, the latency of a consumer route, and Redis's work under a flood of unknown keys.

    cargo build --release && python3 bench/directory.py --consumers 100000    # needs redis-server, redis-cli
    python3 bench/directory.py --consumers 1000000 --binary /tmp/tollgate-before   # another build
    python3 bench/directory.py --consumers 1000 --only restart      # a quick self-check (a few seconds)
    python3 bench/directory.py --consumers 1000000 --cache 10000     # `consumers: { cache: N }` (builds that know it)
    python3 bench/directory.py --only flood --keep /tmp/dirbench     # keep the configs and logs

A fresh redis-server (`--save ''`), an upstream (nginx `return 200`, or a Python server when nginx is missing) and
the gateway run on loopback ports. The gateway's config is written by the script: the Redis store, a `consumers:`
block (`api_key` in `x-api-key`, `anonymous: reject`, plans `free` and `pro` with one limit each, too high to
refuse anything), the route `/api` with `consumers: required` and the route `/open` without consumers, and an admin
listener with a token. N consumers are imported through `POST /consumers:import` (NDJSON, BATCH lines a request),
consumer `cI` with one key `tg_` + SHA-256(SEED:I) in hex, so that the script knows every key without storing it.
The measurements (`--only` one of them; all four by default, in this order, sharing one import):

- rss: the gateway's RSS (VmRSS, after SETTLE seconds at rest) with an empty directory, then after the import in
  the instance that imported (and again after it served SERVED_AFTER_IMPORT requests: an allocator gives back
  freed pages as later allocations run), then in a fresh instance that read the N consumers from Redis; bytes per consumer
  are (fresh RSS with N - RSS with none) / N; Redis's `used_memory` the same way; how long the import took, and
  until the importing instance held all N.
- restart: the gateway is stopped and started again with the N consumers in Redis. From the moment it is started,
  CLIENTS threads send requests with valid keys picked at random, as fast as they can (keep-alive, reconnecting
  while the listener is not up), and a poller asks the admin listener for `/readyz` every 50 ms and for
  `GET /consumers` (its `synced`, `total`) every 250 ms until synced. The table gives when the listener accepted,
  when `/readyz` first said `"status":"ready"` (and every change of what it said), when the directory said synced,
  the first 200, the last 401, and the count of each status (a 401 to a valid key is the fault: the instance
  refused a paying customer), over WINDOW seconds at most or until 2 s after the latest of ready, synced and the
  first 200; then the answers in buckets of time until the last 401.
- latency: in a fresh instance (started, synced, no request since), on one keep-alive connection, REQUESTS
  requests each, the three kinds in turn: on `/open` without a key (the baseline), on `/api` with one key
  repeated, and on `/api` with a key never used since the start for each request (a first-seen key); median, p99
  and mean.
- flood: FLOOD seconds of CLIENTS threads sending `/api` with invalid keys, each new, then the same 100 repeated;
  Redis's `INFO commandstats` before and after give its commands per request (net of the instance's background
  checks, measured at rest for as long beforehand), by command, with the count of 401s.

Each table is printed with the command that made it. Every process is stopped at the end, whatever happens. The
gateway logs at `warn` (`DIRBENCH_LOG=info,tollgate::consumers=debug` says when the directory was read).
"""

import argparse
import hashlib
import http.client
import http.server
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLLGATE = ROOT / "target/release/tollgate"
ADMIN_TOKEN = "dirbench-admin-token-0123456789"
PREFIX = "dirbench:"
# The issue time written in every imported key record (any fixed value: the gateway does not read it).
CREATED_MS = 1_764_000_000_000
# How often the restart's poller asks /readyz, and how often anything waiting asks GET /consumers (a pass over
# the whole directory in the instance: asked too often, it slows what it watches).
POLL_S = 0.05
DIRECTORY_POLL_S = 0.25
MODES = ["rss", "restart", "latency", "flood"]
# Attempts of one import request answered 503.
IMPORT_ATTEMPTS = 5
# Requests the instance that imported serves before its RSS is read again.
SERVED_AFTER_IMPORT = 5_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_key(seed: str, i: int) -> str:
    """Consumer `c{i}`'s API key: what an issued key looks like, derived so that nothing needs storing."""
    return "tg_" + hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()


def import_line(seed: str, i: int) -> str:
    digest = hashlib.sha256(api_key(seed, i).encode()).hexdigest()
    plan = "pro" if i % 2 else "free"
    return (f'{{"consumer":"c{i}","record":{{"plan":"{plan}","keys":'
            f'[{{"id":"k_{i:x}","sha256":"{digest}","created_ms":{CREATED_MS}}}]}}}}')


class Redis:
    """A fresh redis-server on a free loopback port, without persistence."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder),
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit("directory: redis-server did not start")
            time.sleep(0.01)

    def cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def info(self, section: str) -> dict[str, str]:
        fields = {}
        for line in self.cli("INFO", section).splitlines():
            name, sep, value = line.partition(":")
            if sep:
                fields[name] = value
        return fields

    def used_memory(self) -> int:
        return int(self.info("memory")["used_memory"])

    def command_calls(self) -> Counter:
        """Calls per command so far, the script's own INFO left out."""
        calls = Counter()
        for name, value in self.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            if command != "info":
                calls[command] = int(value.split(",")[0].removeprefix("calls="))
        return calls

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class Upstream:
    """What the routes proxy to: nginx answering 200 "ok" (one process, keep-alive), or a Python server in a
    thread of this process when nginx is not installed."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.process = None
        self.server = None
        if shutil.which("nginx"):
            work = folder / "nginx"
            (work / "logs").mkdir(parents=True, exist_ok=True)
            # No master process: the one process serves, so that killing it leaves no worker behind.
            (work / "nginx.conf").write_text(f"""worker_processes 1;
daemon off;
master_process off;
pid {work}/nginx.pid;
error_log {work}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    server {{ listen 127.0.0.1:{self.port}; location / {{ return 200 "ok"; }} }}
}}
""")
            self.process = subprocess.Popen(["nginx", "-p", str(work), "-c", str(work / "nginx.conf")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            class Ok(http.server.BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"

                def do_GET(self):
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")

                def log_message(self, *args):
                    pass

            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Ok)
            threading.Thread(target=self.server.serve_forever, daemon=True).start()
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("directory: the upstream did not start")
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        if self.server is not None:
            self.server.shutdown()


class Gateway:
    """One tollgate on fixed ports (the same across restarts, so that clients reconnect to it)."""

    def __init__(self, binary: Path, folder: Path, redis: Redis, upstream: Upstream, cache: int | None):
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.admin = free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        cache_line = f"  cache: {cache}\n" if cache is not None else ""
        self.config = folder / "gateway.yaml"
        self.config.write_text(f"""listen: 127.0.0.1:{self.port}
admin:
  listen: 127.0.0.1:{self.admin}
  token: {ADMIN_TOKEN}
store:
  backend: redis
  url: redis://127.0.0.1:{redis.port}
  timeout: 250ms
  on_error: deny
  key_prefix: "{PREFIX}"
upstreams:
  origin:
    targets: ["http://127.0.0.1:{upstream.port}"]
    timeout: 5s
consumers:
{cache_line}  identify:
    - api_key: {{ header: x-api-key }}
  anonymous: reject
  plans:
    free:
      limits: [{{ name: hourly, key: consumer, algorithm: gcra, rate: 100000000/1h, burst: 1000000 }}]
    pro:
      limits: [{{ name: daily, key: consumer, algorithm: fixed_window, limit: 1000000000, period: 1d }}]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: origin
    consumers: required
  - name: open
    match: {{ path_prefix: /open }}
    upstream: origin
    consumers: off
""")

    def start(self) -> float:
        """Starts the process and returns the moment it was started (time.monotonic), without waiting."""
        self.starts += 1
        log = open(self.folder / f"gateway.{self.starts}.log", "w")
        started = time.monotonic()
        env = dict(os.environ, RUST_LOG=os.environ.get("DIRBENCH_LOG", "warn"))
        self.process = subprocess.Popen([str(self.binary), "--config", str(self.config)], stdout=log,
                                        stderr=subprocess.STDOUT, env=env)
        log.close()
        return started

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            sys.exit(f"directory: the gateway exited (see {self.folder}/gateway.{self.starts}.log)")

    def rss_bytes(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        sys.exit("directory: no VmRSS in /proc")

    def admin_call(self, method: str, path: str, body: bytes | None = None,
                   timeout: float = 5) -> tuple[int, dict]:
        """One admin request; (0, {}) when the listener does not answer."""
        connection = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
            try:
                return response.status, json.loads(text) if text.strip() else {}
            except json.JSONDecodeError:
                return response.status, {"text": text}
        except (OSError, http.client.HTTPException):
            return 0, {}
        finally:
            connection.close()

    def directory(self) -> tuple[bool, int | None]:
        """(synced, total) as `GET /consumers` says them; (False, None) when it does not answer. The page asked
        for is past every id (`~` sorts after every character an id may hold): a listing collects and sorts the
        page's records out of the whole directory, which at a million consumers costs the instance a core for a
        good part of a second, while filtering them all out costs a pass over the map."""
        status, page = self.admin_call("GET", "/consumers?limit=1&after=~")
        if status == 400 and page.get("error") == "listed_in_redis":
            # `consumers.cache`: the instance holds only some consumers, and is synced once it is ready.
            return True, None
        if status != 200:
            return False, None
        return bool(page.get("synced")), page.get("total")

    def wait_synced(self, started: float, consumers: int) -> tuple[float, int | None]:
        """Waits until /readyz says ready and the directory says synced; returns the seconds since `started` and
        the directory's total then."""
        deadline = time.monotonic() + 60 + consumers / 10_000
        while time.monotonic() < deadline:
            self.alive()
            status, body = self.admin_call("GET", "/readyz", timeout=1)
            if status == 200 and body.get("status") == "ready":
                synced, total = self.directory()
                if synced:
                    return time.monotonic() - started, total
            time.sleep(DIRECTORY_POLL_S)
        sys.exit(f"directory: the gateway was not ready and synced within the deadline ({self.folder})")

    def restart(self, consumers: int) -> tuple[float, int | None]:
        self.stop()
        return self.wait_synced(self.start(), consumers)


class Imported:
    """How an import went: seconds making the bodies (the script), waiting for the gateway's answers, and from
    the last answer until the importing instance listed all; the 503s answered and retried."""

    def __init__(self):
        self.making = self.sending = self.listed = 0.0
        self.retried: list[str] = []


def import_consumers(gateway: Gateway, consumers: int, seed: str, batch: int) -> Imported:
    """Imports consumers c0..c{N-1}, BATCH a request. A request answered 503 (Redis did not take a write in time:
    part of the batch may be in) is sent again, up to IMPORT_ATTEMPTS times: an import replaces each record whole,
    so sending a line twice leaves what sending it once does."""
    imported = Imported()
    for first in range(0, consumers, batch):
        begun = time.monotonic()
        body = ("\n".join(import_line(seed, i) for i in range(first, min(first + batch, consumers))) + "\n").encode()
        sent = time.monotonic()
        imported.making += sent - begun
        for attempt in range(IMPORT_ATTEMPTS):
            status, answer = gateway.admin_call("POST", "/consumers:import", body, timeout=600)
            if status != 503 or attempt + 1 == IMPORT_ATTEMPTS:
                break
            imported.retried.append(f"lines {first:,}..: {answer.get('detail', answer)}")
            time.sleep(1)
        imported.sending += time.monotonic() - sent
        if status != 200:
            sys.exit(f"directory: import of lines {first}.. answered {status}: {answer}")
    answered = time.monotonic()
    deadline = answered + 60 + consumers / 10_000
    # With `consumers.cache` no instance lists the directory: the import's answer is the end of it.
    while gateway.directory() not in ((True, None), (True, consumers)):
        gateway.alive()
        if time.monotonic() > deadline:
            sys.exit(f"directory: the importing instance never listed {consumers} consumers")
        time.sleep(DIRECTORY_POLL_S)
    imported.listed = time.monotonic() - answered
    return imported


def table(title: str, rows: list[tuple[str, str]], head: tuple[str, str] = ("measure", "value")) -> None:
    print(f"\n{title}\n")
    print(f"| {head[0]} | {head[1]} |")
    print("|---|--:|")
    for what, value in rows:
        print(f"| {what} | {value} |")
    sys.stdout.flush()


def mb(size: float) -> str:
    return f"{size / 1e6:,.1f} MB"


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def serve(gateway: Gateway, requests: int) -> None:
    """`requests` requests on `/open`, one keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    for _ in range(requests):
        connection.request("GET", "/open")
        connection.getresponse().read()
    connection.close()


def measure_rss(gateway: Gateway, redis: Redis, args) -> list[tuple[str, str]]:
    """Empty directory, then N imported, then a fresh instance reading the N."""
    started = gateway.start()
    ready_empty, _ = gateway.wait_synced(started, 0)
    time.sleep(args.settle)
    rss_empty, redis_empty = gateway.rss_bytes(), redis.used_memory()
    imported = import_consumers(gateway, args.consumers, args.seed, args.batch)
    time.sleep(args.settle)
    rss_importer = gateway.rss_bytes()
    # A gateway at rest never gives back what its allocator keeps; one serving requests does (mimalloc returns
    # freed pages from the allocations that follow).
    serve(gateway, SERVED_AFTER_IMPORT)
    time.sleep(args.settle)
    rss_importer_serving = gateway.rss_bytes()
    ready_full, total = gateway.restart(args.consumers)
    time.sleep(args.settle)
    rss_full, redis_full = gateway.rss_bytes(), redis.used_memory()
    n = args.consumers
    return [
        ("consumers imported; import requests", f"{n:,}; {-(-n // args.batch)} of up to {args.batch:,} lines"),
        ("import: making the NDJSON (the script)", seconds(imported.making)),
        ("import: the gateway's answers", f"{seconds(imported.sending)} ({n / imported.sending:,.0f} consumers/s)"),
        ("import: requests answered 503 and sent again", "; ".join(imported.retried) or "none"),
        ("import: from the last answer until the instance lists all", seconds(imported.listed)),
        ("gateway RSS, empty directory", mb(rss_empty)),
        ("gateway RSS, the instance that imported", mb(rss_importer)),
        ("gateway RSS, a fresh instance with all", mb(rss_full)),
        ("**bytes per consumer** (fresh instance)", f"**{(rss_full - rss_empty) / n:,.0f}**"),
        ("bytes per consumer (the instance that imported)", f"{(rss_importer - rss_empty) / n:,.0f}"),
        (f"gateway RSS, the instance that imported, after serving {SERVED_AFTER_IMPORT:,} requests",
         f"{mb(rss_importer_serving)} ({(rss_importer_serving - rss_empty) / n:,.0f} bytes per consumer)"),
        ("Redis used_memory, empty / with all", f"{mb(redis_empty)} / {mb(redis_full)}"),
        ("Redis bytes per consumer", f"{(redis_full - redis_empty) / n:,.0f}"),
        ("fresh instance ready and synced after", f"{seconds(ready_full)} (empty: {seconds(ready_empty)}), "
                                                  f"total {total}"),
    ]


class Load:
    """CLIENTS threads sending GET /api with keys from `pick` as fast as they can, on keep-alive connections,
    reconnecting whenever one fails; each answer is kept as (seconds since `since`, status), 0 for no answer."""

    def __init__(self, port: int, clients: int, pick, since: float):
        self.port = port
        self.pick = pick
        self.since = since
        self.stopping = threading.Event()
        self.answers: list[list[tuple[float, int]]] = [[] for _ in range(clients)]
        self.accepted: list[float] = []
        self.first_ok: float | None = None
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(clients)]
        for thread in self.threads:
            thread.start()

    def run(self, index: int) -> None:
        rng = random.Random(index)
        answers = self.answers[index]
        connection = None
        while not self.stopping.is_set():
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                try:
                    connection.connect()
                except OSError:
                    connection = None
                    time.sleep(0.002)
                    continue
                self.accepted.append(time.monotonic() - self.since)
            try:
                connection.request("GET", "/api/item", headers={"x-api-key": self.pick(rng)})
                response = connection.getresponse()
                response.read()
                answers.append((time.monotonic() - self.since, response.status))
                if response.status == 200 and self.first_ok is None:
                    self.first_ok = answers[-1][0]
            except (OSError, http.client.HTTPException):
                answers.append((time.monotonic() - self.since, 0))
                connection.close()
                connection = None
        if connection is not None:
            connection.close()

    def stop(self) -> list[tuple[float, int]]:
        self.stopping.set()
        for thread in self.threads:
            thread.join()
        return sorted(answer for answers in self.answers for answer in answers)


def readiness_timeline(polls: list[tuple[float, str]]) -> str:
    """What /readyz said, each change with the moment it was first seen: `degraded (why) at 0.05 s; ready at ..`."""
    changes = []
    for at, said in polls:
        if not changes or changes[-1][1] != said:
            changes.append((at, said))
    return "; ".join(f"{said} at {at:.2f} s" for at, said in changes) or "no answer"


def measure_restart(gateway: Gateway, args) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Stops the gateway, starts it under load with valid keys, and follows /readyz and the directory."""
    gateway.stop()
    n, seed = args.consumers, args.seed
    started = gateway.start()
    load = Load(gateway.port, args.clients, lambda rng: api_key(seed, rng.randrange(n)), started)
    polls: list[tuple[float, str]] = []
    ready_at = synced_at = None
    synced_total = None
    directory_asked = 0.0
    end = started + args.window
    try:
        while time.monotonic() < end:
            gateway.alive()
            at = time.monotonic() - started
            status, body = gateway.admin_call("GET", "/readyz", timeout=1)
            said = "no answer" if status == 0 else f"{status} {body.get('status')}" + (
                f" ({body['reason']})" if body.get("reason") else "")
            polls.append((at, said))
            if ready_at is None and status == 200 and body.get("status") == "ready":
                ready_at = at
            if synced_at is None and at - directory_asked >= DIRECTORY_POLL_S:
                directory_asked = at
                synced, total = gateway.directory()
                if synced:
                    synced_at, synced_total = time.monotonic() - started, total
            if None not in (ready_at, synced_at, load.first_ok):
                end = min(end, started + max(ready_at, synced_at, load.first_ok) + 2)
            time.sleep(POLL_S)
    finally:
        answers = load.stop()
    statuses = Counter(status for _, status in answers)
    first_200 = next((t for t, s in answers if s == 200), None)
    refusals = [t for t, s in answers if s == 401]
    refused_ready = sum(1 for t in refusals if ready_at is not None and t >= ready_at)
    others = ", ".join(f"{s or 'no answer'}: {c:,}" for s, c in sorted(statuses.items()) if s not in (200, 401))
    span = answers[-1][0] - answers[0][0] if len(answers) > 1 else 0
    rows = [
        ("consumers in Redis", f"{n:,}"),
        ("listener accepts at", seconds(min(load.accepted, default=None))),
        ("/readyz first answers at", seconds(next((t for t, s in polls if s != "no answer"), None))),
        ("/readyz says ready at", seconds(ready_at)),
        ("what /readyz said", readiness_timeline(polls)),
        ("GET /consumers says synced at (polled every 250 ms)", f"{seconds(synced_at)}, total {synced_total}"),
        ("first 200 at", seconds(first_200)),
        ("**401s to valid keys**", f"**{len(refusals):,}**" + (
            f", the last at {refusals[-1]:.2f} s" if refusals else "")),
        ("401s after /readyz said ready (polled every 50 ms)", f"{refused_ready:,}"),
        ("200s", f"{statuses[200]:,}"),
        ("other answers", others or "none"),
        ("requests, over", f"{len(answers):,}, {span:.1f} s ({len(answers) / span if span else 0:,.0f}/s, "
                           f"{args.clients} clients)"),
    ]
    return rows, timeline(answers)


def timeline(answers: list[tuple[float, int]]) -> tuple[float, list[tuple[str, str]]]:
    """Answers per bucket of time until the last 401 (and one bucket after), as `200 / 401 / other`: buckets of
    half a second, or wider so that there are at most about 20."""
    refusals = [t for t, s in answers if s == 401]
    if not refusals:
        return 0.5, []
    width = next(w for w in (0.5, 1, 2, 5, 10, 30, 60) if refusals[-1] / w < 20 or w == 60)
    last = int(refusals[-1] / width) + 1
    buckets: dict[int, Counter] = {}
    for at, status in answers:
        bucket = int(at / width)
        if bucket > last:
            break
        buckets.setdefault(bucket, Counter())[status if status in (200, 401) else "other"] += 1
    return width, [(f"{b * width:g}-{(b + 1) * width:g} s", f"{c[200]:,} / {c[401]:,} / {c['other']:,}")
                   for b, c in sorted(buckets.items())]


def measure_latency(gateway: Gateway, args) -> list[tuple[str, str]]:
    """On a fresh instance: one keep-alive connection, REQUESTS requests per kind, the kinds taken in turn (one of
    each, again and again) so that the machine's drift falls on all three alike."""
    ready, _ = gateway.restart(args.consumers)
    rng = random.Random(args.seed)
    count = min(args.requests, args.consumers - 1)
    indices = rng.sample(range(args.consumers), count + 1)
    repeated = api_key(args.seed, indices[0])
    first_seen = (api_key(args.seed, i) for i in indices[1:])
    kinds = [
        ("no key, route without consumers (baseline)", "/open/item", lambda: None),
        ("one key, repeated (seen before)", "/api/item", lambda: repeated),
        ("a first-seen key each request", "/api/item", lambda: next(first_seen)),
    ]
    times: list[list[float]] = [[] for _ in kinds]
    statuses: list[Counter] = [Counter() for _ in kinds]
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)

    def get(path: str, key: str | None) -> tuple[float, int]:
        begun = time.perf_counter()
        connection.request("GET", path, headers={"x-api-key": key} if key else {})
        response = connection.getresponse()
        response.read()
        return time.perf_counter() - begun, response.status

    try:
        for _ in range(200):
            get("/open/warm", None)
            get("/api/warm", repeated)
        for _ in range(count):
            for kind, (_, path, key) in enumerate(kinds):
                took, status = get(path, key())
                times[kind].append(took)
                statuses[kind][status] += 1
    finally:
        connection.close()
    rows = [("consumers in Redis; the fresh instance synced after", f"{args.consumers:,}; {seconds(ready)}")]
    for (label, _, _), took, answered in zip(kinds, times, statuses):
        took.sort()
        p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
        answers = ", ".join(f"{status}: {n:,}" for status, n in sorted(answered.items()))
        rows.append((f"{label}: median / p99 / mean",
                     f"{statistics.median(took) * 1e6:,.0f} / {p99 * 1e6:,.0f} / "
                     f"{statistics.fmean(took) * 1e6:,.0f} µs ({answers})"))
    return rows


def measure_flood(gateway: Gateway, redis: Redis, args) -> list[tuple[str, str]]:
    """Invalid keys, each new then 100 repeated; Redis's commands per request net of the background checks."""
    before = redis.command_calls()
    time.sleep(args.flood)
    background = sum((redis.command_calls() - before).values()) / args.flood
    pool = ["tg_" + random.Random(f"{args.seed}:bad:{i}").randbytes(32).hex() for i in range(100)]
    rows = [("consumers in Redis", f"{args.consumers:,}"),
            ("Redis commands per second at rest (the instance's checks)", f"{background:.1f}")]
    for label, pick in (("each key new", lambda rng: "tg_" + rng.randbytes(32).hex()),
                        ("the same 100 keys repeated", lambda rng: rng.choice(pool))):
        before = redis.command_calls()
        started = time.monotonic()
        load = Load(gateway.port, args.clients, pick, started)
        time.sleep(args.flood)
        answers = load.stop()
        elapsed = time.monotonic() - started
        moved = redis.command_calls() - before
        statuses = Counter(status for _, status in answers)
        net = max(0.0, sum(moved.values()) - background * elapsed)
        by_command = ", ".join(f"{name} {calls:,}" for name, calls in moved.most_common(6)) or "none"
        rows += [
            (f"{label}: requests (401s)", f"{len(answers):,} ({statuses[401]:,}; others: "
                                         f"{len(answers) - statuses[401]:,}) in {elapsed:.1f} s"),
            (f"{label}: **Redis commands per request** (net of the checks at rest)",
             f"**{net / max(1, len(answers)):.3f}** ({sum(moved.values()):,} in all)"),
            (f"{label}: Redis commands by name (a script's own calls count too)", by_command),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=TOLLGATE, help="the tollgate to measure")
    parser.add_argument("--consumers", type=int, default=100_000, help="runtime consumers imported (N)")
    parser.add_argument("--cache", type=int, metavar="N",
                        help="write `cache: N` under `consumers:` (only for a build that knows the key)")
    parser.add_argument("--only", choices=MODES, help="one measurement")
    parser.add_argument("--keep", type=Path, help="write the configs and logs into this folder and keep them")
    parser.add_argument("--batch", type=int, default=50_000, help="lines per import request")
    parser.add_argument("--seed", default="dirbench", help="what the keys are derived from")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds at rest before reading RSS")
    parser.add_argument("--clients", type=int, default=8, help="client threads of the restart and flood loads")
    parser.add_argument("--window", type=float, default=15.0, help="longest restart measurement, in seconds")
    parser.add_argument("--requests", type=int, default=2000, help="requests per kind in the latency measurement")
    parser.add_argument("--flood", type=float, default=10.0, help="seconds of each flood of invalid keys")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            sys.exit(f"directory: {tool} not found (apt-get install redis-server)")
    if not args.binary.exists():
        sys.exit(f"directory: no {args.binary}: build first (cargo build --release)")
    if args.consumers < 2:
        sys.exit("directory: --consumers must be at least 2")
    modes = [args.only] if args.only else MODES
    command = "python3 bench/directory.py " + shlex.join(sys.argv[1:])

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        folder = args.keep
    else:
        temporary = tempfile.TemporaryDirectory(prefix="dirbench.")
        folder = Path(temporary.name)
    redis = upstream = gateway = None
    try:
        redis = Redis(folder)
        upstream = Upstream(folder)
        gateway = Gateway(args.binary, folder, redis, upstream, args.cache)
        print(f"`{command}`  \n{args.binary}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (a shared machine slows every figure)")
        if "rss" in modes:
            table("Memory per consumer", measure_rss(gateway, redis, args))
        else:
            gateway.wait_synced(gateway.start(), 0)
            imported = import_consumers(gateway, args.consumers, args.seed, args.batch)
            retried = f"; 503 and sent again: {'; '.join(imported.retried)}" if imported.retried else ""
            print(f"\n({args.consumers:,} consumers imported in {imported.sending:.1f} s, listed "
                  f"{imported.listed:.1f} s later{retried})")
        if "restart" in modes:
            rows, (width, buckets) = measure_restart(gateway, args)
            table("Restart under load with valid keys", rows)
            if buckets:
                table(f"Answers per {width:g} s after the start, until the last 401", buckets,
                      ("since the start", "200 / 401 / other"))
        if "latency" in modes:
            table("Latency on one keep-alive connection", measure_latency(gateway, args))
        if "flood" in modes:
            if gateway.process is None:
                gateway.wait_synced(gateway.start(), args.consumers)
            table(f"A flood of invalid keys, {args.flood:.0f} s each", measure_flood(gateway, redis, args))
    finally:
        for part in (gateway, upstream, redis):
            if part is not None:
                part.stop()
        if args.keep:
            print(f"\n(configs and logs in {folder})")
        else:
            temporary.cleanup()


if __name__ == "__main__":
    main()
