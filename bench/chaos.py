#!/usr/bin/env python3
"""The faults operators cause, applied in turn to two tollgate instances sharing one Redis, under a steady load.

    cargo build --release && python3 bench/chaos.py          # needs redis-server and redis-cli (scripts/test.sh)
    python3 bench/chaos.py --binary target/debug/tollgate     # another build
    python3 bench/chaos.py --only restart                     # one fault
    python3 bench/chaos.py --on-error deny                    # 503 while Redis is away, none once it is back

Both gateways run `on_error: local` (or `--on-error`), so while Redis is away each limits from its own memory;
that is the policy, and requests it answers 200 or 429 are within it (with `deny`, 503 too, until the gateways
share limits again). For every fault the table gives:

- requests: answered during the fault (a steady loop on each gateway, plus the probes and the exactness check);
- failed beyond policy: any answer but 200 or 429, or no answer at all;
- over-admitted: after recovery, 40 requests on one key alternate between the two gateways against a `sliding_log`
  limit of 20 per hour; every admission past 20 is over-admitted (limits not shared);
- counted late: requests answered without Redis that Redis counted all the same. Each loop also sends, on every
  turn, a request on a fresh key of a `sliding_log` route (limit 1000 per hour); once the fault is over (and the
  fallback's admissions carried into Redis), each of those keys' sorted sets is read: a key whose request was
  answered 503 must hold nothing, and no key may hold more than its one request (a check Redis ran after the
  gateway had answered without it, then counted again when the fallback's admissions were carried over). Must be
  0: with `allow`, a late count looks like an ordinary one and is not seen;
- worst 10 s: the most requests admitted on one key, by both gateways together, within any 10 s (the loops send
  it on every turn, against a `sliding_log` limit of 50 per 10 s); first over the windows that start when the
  fault does or later, then over all of them. With the local fallback each instance limits on its own while Redis
  is away, and what it admitted is carried into Redis when it is back, so from the outage's start two instances
  admit at most twice the limit (100) in any window; a window that also holds the moments before the outage can
  hold what Redis admitted then, up to one limit more (150). 50 whenever the limit stayed shared;
- shared again after: from the moment Redis answers again (or the fault is undone) to the first probe that shows
  the limit shared: a new key admitted by one gateway and refused by the other (limit 1). Probes run every 10 ms,
  so the figure is good to about that. "no outage" means the fault never stopped the limit being shared (the
  gateways kept deciding through Redis), so there was nothing to recover from; the fault is undone all the same.

Faults: Redis not up when the gateways start; Redis paused (`CLIENT PAUSE WRITE`: checks wait in Redis past their
deadline, then run); Redis frozen (SIGSTOP: the same, below Redis); Redis restarted with its data; Redis replaced by an empty instance;
the password changed under the gateways (connections killed) then changed back; Redis out of memory
(`maxmemory` below what it holds, `noeviction`) then given memory again; Redis down for 12 s, longer than the
window route's period, with the load running 10 s on after it. Only loopback addresses are used, and
every loop is bounded in count and time.

Slots held (`--only slots`): two gateways (`--on-error`) in front of an upstream that holds requests and counts
those in flight, a `concurrency` limit of `max: 4` on one key. Gateway A holds 4 requests at the upstream while
gateway B asks for a slot of the key every 20 ms, through Redis restarted empty (leases of 30 s) and through Redis
out of memory for 5 s (`maxmemory 1`, leases of 1 s: every lease ends unrenewed), and for 4 s after Redis answers
again. The table gives the most requests ever in flight at the upstream against `max`, over the whole run (while
Redis is away, `on_error: local` lets each instance decide alone: up to `max` per instance) and from B's first
reply of Redis after the fault (never past `max`), what B admitted before and after it, the WARN lines that said the
loss, and how long after A's requests end B is admitted again.
"""

import argparse
import binascii
import datetime
import http.client
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "chaos-pass"
EXACT_LIMIT = 20
# The window route's limit per 10 s, and the window itself: two instances admit at most twice it over any window.
WINDOW_LIMIT = 50
WINDOW_S = 10.0
# On a Cluster: key values found in the moved slot, and how many of them the ledger leaves to the probes.
POOL_SIZE = 700
# Runtime consumers in the directory-flush measurement.
CONSUMERS = 200
POOL_RESERVE = 150
RECOVERY_BOUND_S = 10.0
# Limits are shared again within this of Redis answering again (the gateway's promise).
RECOVERY_PROMISE_S = 0.3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server on a loopback port, started and stopped on demand; its data lives in `folder`."""

    def __init__(self, port: int, folder: Path):
        self.port = port
        self.folder = folder
        self.process: subprocess.Popen | None = None

    def start(self, password: str = PASSWORD) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--requirepass", password, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.cli("PING", password=password) != "PONG":
            if time.monotonic() > deadline:
                sys.exit("chaos: redis-server did not start")
            time.sleep(0.005)

    def cli(self, *args: str, password: str = PASSWORD) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a", password, *args],
            capture_output=True, text=True, timeout=5,
        )
        return out.stdout.strip()

    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}"

    def ledger_sizes(self) -> dict[str, int]:
        return ledger_sizes_on(self.port)

    def stop(self, save: bool = False) -> None:
        if self.process is None:
            return
        if save:
            self.cli("SAVE")
        self.process.kill()
        self.process.wait()
        self.process = None


def ledger_sizes_on(port: int) -> dict[str, int]:
    """The number of entries of each ledger key one Redis server holds, by key value."""
    names = subprocess.run(
        ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", PASSWORD, "--scan", "--pattern", "chaos:ledger:*"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()
    replies = subprocess.run(
        ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", PASSWORD],
        input="".join(f"ZCARD {name}\n" for name in names), capture_output=True, text=True, timeout=60,
    ).stdout.split()
    sizes = {}
    for name, size in zip(names, replies):
        sizes[name[name.rfind("{") + 1:name.rfind("}")]] = int(size) if size.isdigit() else 0
    return sizes


def cluster_port() -> int:
    """A free port whose cluster bus port (10,000 above) is free too."""
    for _ in range(1000):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    sys.exit("chaos: no free port pair for a cluster node")


def key_slot(value: str) -> int:
    """The Redis Cluster hash slot of a key whose hash tag is `value` (CRC16-XMODEM, as Redis computes it)."""
    return binascii.crc_hqx(value.encode(), 0) % 16384


class Cluster:
    """Three Redis Cluster masters on loopback ports, password-protected, with a slot that can be moved."""

    def __init__(self, folder: Path):
        self.ports = [cluster_port() for _ in range(3)]
        self.processes = []
        for port in self.ports:
            data = folder / f"cluster-{port}"
            data.mkdir(parents=True)
            self.processes.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--requirepass", PASSWORD,
                 "--masterauth", PASSWORD, "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        for port in self.ports:
            deadline = time.monotonic() + 10
            while self.cli(port, "PING") != "PONG":
                if time.monotonic() > deadline:
                    sys.exit("chaos: a cluster node did not start")
                time.sleep(0.01)
        created = subprocess.run(
            ["redis-cli", "--no-auth-warning", "-a", PASSWORD, "--cluster", "create",
             *[f"127.0.0.1:{port}" for port in self.ports], "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
        if created.returncode != 0:
            sys.exit(f"chaos: redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in self.cli(port, "CLUSTER", "INFO") for port in self.ports):
            if time.monotonic() > deadline:
                sys.exit("chaos: the cluster never reached cluster_state:ok")
            time.sleep(0.05)

    @staticmethod
    def cli(port: int, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", PASSWORD, *args],
            capture_output=True, text=True, timeout=10,
        )
        return out.stdout.strip()

    def url(self) -> str:
        seeds = "&".join(f"node=127.0.0.1:{port}" for port in self.ports[1:])
        return f"redis-cluster://:{PASSWORD}@127.0.0.1:{self.ports[0]}?{seeds}"

    def ledger_sizes(self) -> dict[str, int]:
        sizes = {}
        for port in self.ports:
            sizes.update(ledger_sizes_on(port))
        return sizes

    def owner(self, slot: int) -> int:
        """The index of the node that serves `slot`."""
        for line in self.cli(self.ports[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            for ranges in fields[8:]:
                low, _, high = ranges.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return self.ports.index(int(fields[1].split(":")[1].split("@")[0]))
        sys.exit(f"chaos: no node serves slot {slot}")

    def migrate(self, slot: int) -> None:
        """Moves `slot` to the next node in its three steps, under the running load: both ends marked, the keys
        moved, the slot handed over on every node."""
        source = self.owner(slot)
        target = (source + 1) % 3
        source_id = self.cli(self.ports[source], "CLUSTER", "MYID")
        target_id = self.cli(self.ports[target], "CLUSTER", "MYID")
        self.cli(self.ports[target], "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
        self.cli(self.ports[source], "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
        time.sleep(0.3)
        while keys := self.cli(self.ports[source], "CLUSTER", "GETKEYSINSLOT", str(slot), "1000").split():
            self.cli(self.ports[source], "MIGRATE", "127.0.0.1", str(self.ports[target]), "", "0", "5000",
                     "AUTH", PASSWORD, "KEYS", *keys)
        time.sleep(0.3)
        for node in (target, source, (source + 2) % 3):
            self.cli(self.ports[node], "CLUSTER", "SETSLOT", str(slot), "NODE", target_id)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


class Gateway:
    """A tollgate process with routes for the steady load, the probes and the exactness check."""

    def __init__(self, binary: Path, folder: Path, name: str, redis_url: str | None, on_error: str,
                 extra: str = "", wrapper: list[str] | None = None, routes: str = ""):
        self.port = free_port()
        self.admin = admin = free_port()
        config = folder / f"{name}.yaml"
        store = (f"  backend: redis\n  url: {redis_url}\n  timeout: 50ms\n  on_error: {on_error}\n"
                 '  key_prefix: "chaos:"') if redis_url else "  backend: memory"
        config.write_text(f"""listen: 127.0.0.1:{self.port}
admin:
  listen: 127.0.0.1:{admin}
  token: {ADMIN_TOKEN}
store:
{store}
{extra}routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok" }}
  - name: steady
    match: {{ path_prefix: /steady }}
    respond: {{ status: 200, body: "ok" }}
    limits: [{{ name: per-key, key: ["header:x-key"], algorithm: fixed_window, limit: 100000000, period: 1h }}]
  - name: probe
    match: {{ path_prefix: /probe }}
    respond: {{ status: 200, body: "ok" }}
    limits: [{{ name: once, key: ["header:x-key"], algorithm: sliding_log, limit: 1, period: 1h }}]
  - name: ledger
    match: {{ path_prefix: /ledger }}
    respond: {{ status: 200, body: "ok" }}
    limits: [{{ name: n, key: ["header:x-key"], algorithm: sliding_log, limit: 1000, period: 1h }}]
  - name: window
    match: {{ path_prefix: /window }}
    respond: {{ status: 200, body: "ok" }}
    limits: [{{ name: n, key: ["header:x-key"], algorithm: sliding_log, limit: {WINDOW_LIMIT}, period: 10s }}]
  - name: exact
    match: {{ path_prefix: /exact }}
    respond: {{ status: 200, body: "ok" }}
    limits: [{{ name: n, key: ["header:x-key"], algorithm: sliding_log, limit: {EXACT_LIMIT}, period: 1h }}]
{routes}""")
        self.log_path = folder / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [*(wrapper or []), str(binary), "--config", str(config)], stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, RUST_LOG="warn"),
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"chaos: {name} did not start (see {folder / (name + '.log')})")
                time.sleep(0.02)
        self.local = threading.local()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, key: str, header: str = "x-key") -> int:
        """One request on this thread's keep-alive connection; the status, or 0 when none came."""
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            self.local.connection = connection
        try:
            connection.request("GET", path, headers={header: key})
            response = connection.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            connection.close()
            self.local.connection = None
            return 0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class Tally:
    """Answers counted by status, shared by the threads of one fault. 200 and 429 are always within policy; 503
    (`on_error: deny`) is within it only until the gateways share limits again (`recovered_at`), or the bound
    the gateway promises for that after the fault is undone (`fixed_at` + RECOVERY_PROMISE_S), whichever is later:
    the time they take to see Redis whole is the recovery column's, and a 503 after both is a failure. (A probe
    can find the limit shared while a request one gateway sent a moment before is still on its way.)"""

    def __init__(self, pool: list[str] | None = None):
        # Key values in the slot being moved (on a Cluster), taken once each; see `fresh`.
        self.pool = pool
        self.lock = threading.Lock()
        self.total = 0
        self.beyond_policy = 0
        self.recovered_at: float | None = None
        self.fixed_at: float | None = None
        # (key, status) of each request on a fresh key of the ledger route
        self.ledger: list[tuple[str, int]] = []
        # when each request on the window route's one key was admitted
        self.window_admissions: list[float] = []
        self.window_key = self.fresh()
        self.broken_at: float | None = None

    def add(self, status: int) -> None:
        with self.lock:
            self.total += 1
            if status in (200, 429):
                return
            if status == 503 and (self.recovered_at is None
                                  or time.monotonic() < (self.fixed_at or 0) + RECOVERY_PROMISE_S):
                return
            self.beyond_policy += 1

    def fresh(self, reserve: int = 0) -> str:
        """A key value no request has used yet: from the pool while it holds more than `reserve`."""
        if self.pool is not None and len(self.pool) > reserve:
            return self.pool.pop()
        return uuid.uuid4().hex

    def add_window(self, status: int) -> None:
        self.add(status)
        if status == 200:
            with self.lock:
                self.window_admissions.append(time.monotonic())

    def worst_window(self, since: float = 0.0) -> int:
        """The most admissions on the window route's key within any WINDOW_S that starts at `since` or later."""
        times = sorted(at for at in self.window_admissions if at >= since)
        worst, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] >= WINDOW_S:
                start += 1
            worst = max(worst, end - start + 1)
        return worst

    def worst_windows(self) -> str:
        """The worst window from the outage's start on, then the worst of all (with what Redis admitted before)."""
        if self.broken_at is None:
            return f"{self.worst_window()}"
        return f"{self.worst_window(self.broken_at)} / {self.worst_window()}"

    def add_ledger(self, key: str, status: int) -> None:
        self.add(status)
        with self.lock:
            self.ledger.append((key, status))


def counted_late(redis: "Redis | Cluster", tally: Tally) -> int:
    """The ledger's requests Redis counted though the gateway answered without it (503), or counted twice.
    Read after the fault is undone and the fallback's admissions are carried over (a second is plenty)."""
    time.sleep(1.5)
    sizes = redis.ledger_sizes()
    late = 0
    for key, status in tally.ledger:
        held = sizes.get(key, 0)
        late += held > (0 if status == 503 else 1)
    if tally.ledger and not any(sizes.get(key, 0) for key, status in tally.ledger if status == 200):
        sys.exit("chaos: none of the ledger's admitted requests is in Redis: the key layout changed?")
    return late


def steady_load(gateways: list[Gateway], tally: Tally, stop: threading.Event) -> list[threading.Thread]:
    """One loop per gateway, about 200 requests a second each, until `stop` (bounded by 120 s anyway)."""

    def loop(gateway: Gateway) -> None:
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            tally.add(gateway.get("/steady", "steady"))
            key = tally.fresh(reserve=POOL_RESERVE)
            tally.add_ledger(key, gateway.get("/ledger", key))
            tally.add_window(gateway.get("/window", tally.window_key))
            time.sleep(0.005)

    threads = [threading.Thread(target=loop, args=(g,), daemon=True) for g in gateways]
    for thread in threads:
        thread.start()
    return threads


def shared(gateways: list[Gateway], tally: Tally) -> bool:
    """Whether a new key admitted by the first gateway is refused by the second (limit 1)."""
    key = tally.fresh()
    first = gateways[0].get("/probe", key)
    second = gateways[1].get("/probe", key)
    tally.add(first)
    tally.add(second)
    return first == 200 and second == 429


def time_to_shared(gateways: list[Gateway], tally: Tally, since: float) -> float | None:
    tally.fixed_at = since
    while time.monotonic() - since < RECOVERY_BOUND_S:
        if shared(gateways, tally):
            tally.recovered_at = time.monotonic()
            return tally.recovered_at - since
        time.sleep(0.01)
    return None


def over_admitted(gateways: list[Gateway], tally: Tally) -> int:
    key = tally.fresh()
    admitted = 0
    for i in range(2 * EXACT_LIMIT):
        status = gateways[i % 2].get("/exact", key)
        tally.add(status)
        admitted += status == 200
    return max(0, admitted - EXACT_LIMIT)


class NoOutage(Exception):
    """The fault did not stop the gateways from sharing limits: there is no recovery to time."""


def wait_for_outage(gateways: list[Gateway], tally: Tally) -> None:
    """Until the gateways stop sharing limits (so that recovery is measured from an outage), at most 5 s."""
    deadline = time.monotonic() + 5
    while shared(gateways, tally):
        if time.monotonic() > deadline:
            raise NoOutage
        time.sleep(0.01)


# === the faults: each breaks Redis under the running gateways, then makes it whole again ===

def restart_break(redis: Redis) -> None:
    redis.stop(save=True)


def replaced_break(redis: Redis) -> None:
    redis.stop()
    shutil.rmtree(redis.folder, ignore_errors=True)


def password_break(redis: Redis) -> None:
    redis.cli("CONFIG", "SET", "requirepass", "changed")
    redis.cli("CLIENT", "KILL", "TYPE", "normal", password="changed")
    redis.cli("CLIENT", "KILL", "TYPE", "pubsub", password="changed")


def password_fix(redis: Redis) -> None:
    redis.cli("CONFIG", "SET", "requirepass", PASSWORD, password="changed")


def freeze(redis: Redis, signal_number: int) -> None:
    assert redis.process is not None
    os.kill(redis.process.pid, signal_number)


FAULTS = {
    "paused": ("Redis paused (CLIENT PAUSE WRITE)",
               lambda redis: redis.cli("CLIENT", "PAUSE", "30000", "WRITE"),
               lambda redis: redis.cli("CLIENT", "UNPAUSE")),
    "frozen": ("Redis frozen (SIGSTOP), then resumed",
               lambda redis: freeze(redis, signal.SIGSTOP),
               lambda redis: freeze(redis, signal.SIGCONT)),
    "restart": ("Redis restarted (data kept)", restart_break, Redis.start),
    "long": ("Redis down 12 s (restarted, data kept)", restart_break, Redis.start, 12.0),
    "replaced": ("Redis replaced by an empty instance", replaced_break, Redis.start),
    "password": ("password changed, then fixed", password_break, password_fix),
    "oom": ("Redis out of memory, then given memory",
            lambda redis: redis.cli("CONFIG", "SET", "maxmemory", "1"),
            lambda redis: redis.cli("CONFIG", "SET", "maxmemory", "0")),
}


def apply(fault, redis: Redis, gateways: list[Gateway], tally: Tally) -> float:
    """Breaks Redis, waits for the gateways to notice, leaves it broken 1 s (or the fault's own time), then fixes
    it; returns when fixed. Fixed even when the gateways never noticed (`NoOutage`), so that the next fault starts
    from a whole Redis."""
    _, breaks, fix, *broken_for = fault
    tally.broken_at = time.monotonic()
    breaks(redis)
    try:
        wait_for_outage(gateways, tally)
        time.sleep(broken_for[0] if broken_for else 1)
    finally:
        fix(redis)
    return time.monotonic()


def slot_migration(binary: Path, folder: Path, on_error: str):
    """Two gateways on a three-node Cluster; under the load, the slot of every key the probes, the exactness
    check, the window and (while the pool lasts) the ledger use is moved to another node. "Shared again after"
    runs from the hand-over's end."""
    cluster = Cluster(folder / "cluster")
    gateways: list[Gateway] = []
    try:
        slot = key_slot("moving")
        pool, n = [], 0
        while len(pool) < POOL_SIZE:
            value = f"m{n}"
            n += 1
            if key_slot(value) == slot:
                pool.append(value)
        if int(Cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", "{" + pool[0] + "}")) != slot:
            sys.exit("chaos: the hash slot computed here is not Redis's")
        gateways = [Gateway(binary, folder, f"cluster-gateway{i}", cluster.url(), on_error) for i in (1, 2)]
        tally = Tally(pool)
        deadline = time.monotonic() + 10
        while not shared(gateways, tally):
            if time.monotonic() > deadline:
                sys.exit("chaos: the gateways never shared limits on the cluster")
            time.sleep(0.05)
        tally = Tally(tally.pool)
        stop = threading.Event()
        threads = steady_load(gateways, tally, stop)
        time.sleep(0.5)
        tally.broken_at = time.monotonic()
        cluster.migrate(slot)
        since = time.monotonic()
        recovery = time_to_shared(gateways, tally, since)
        over = over_admitted(gateways, tally)
        stop.set()
        for thread in threads:
            thread.join()
        return ("Cluster slot migration (3 steps)", tally, over, counted_late(cluster, tally), recovery)
    finally:
        for gateway in gateways:
            gateway.stop()
        cluster.stop()


ADMIN_TOKEN = "chaos-admin-token"


def admin_call(port: int, method: str, path: str, body=None) -> tuple[int, dict]:
    """One admin API call with the token; the status and the JSON body (empty when none)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return status, json.loads(text) if text.strip() else {}


def metric(port: int, name: str) -> float:
    """A metric's value on one admin listener, 0 when absent."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def directory_flush(binary: Path, folder: Path) -> list[tuple[str, str]]:
    """Two gateways share a runtime consumer directory of CONSUMERS consumers, each with an API key, under a steady
    load of their keys; Redis is flushed; once both notice, the directory is re-seeded from its listing (taken
    before, as a backup would be), as docs/operations.md says."""
    redis = Redis(free_port(), folder / "directory-redis")
    redis.start()
    gateways: list[Gateway] = []
    try:
        consumers = """consumers:
  identify:
    - api_key: { header: x-api-key }
  plans:
    pro:
      limits: [{ name: hourly, key: consumer, algorithm: gcra, rate: 100000/1h, burst: 1000 }]
"""
        gateways = [Gateway(binary, folder, f"directory-gateway{i}", redis.url(), "deny", extra=consumers)
                    for i in (1, 2)]
        keys = []
        for i in range(CONSUMERS):
            status, _ = admin_call(gateways[0].admin, "PUT", f"/consumers/c{i}", {"plan": "pro"})
            assert status == 200, status
            status, issued = admin_call(gateways[0].admin, "POST", f"/consumers/c{i}/keys")
            assert status == 201, (status, issued)
            keys.append(issued["key"])
        listing, after = [], ""
        while True:
            status, page = admin_call(gateways[0].admin, "GET", f"/consumers?limit=100&after={after}")
            assert status == 200, page
            listing += page["consumers"]
            if not page.get("next"):
                break
            after = page["next"]

        def admitted_everywhere() -> bool:
            return all(g.get("/api", key, header="x-api-key") == 200 for g in gateways for key in keys[::10])

        deadline = time.monotonic() + 10
        while not admitted_everywhere():
            if time.monotonic() > deadline:
                sys.exit("chaos: the consumers' keys were never admitted on both gateways")
            time.sleep(0.05)
        flushed = time.monotonic()
        redis.cli("FLUSHALL")
        noticed = {}
        while len(noticed) < 2 and time.monotonic() - flushed < RECOVERY_BOUND_S:
            for i, gateway in enumerate(gateways):
                if i not in noticed and metric(gateway.admin, "tollgate_consumer_directory_resets_total") >= 1:
                    noticed[i] = time.monotonic() - flushed
            time.sleep(0.005)
        refused = sum(g.get("/api", key, header="x-api-key") == 401 for g in gateways for key in keys[::10])
        seeding = time.monotonic()
        for consumer in listing:
            status, body = admin_call(gateways[1].admin, "PUT", f"/consumers/{consumer['consumer']}/record",
                                      consumer["record"])
            assert status == 200, body
        seeded = time.monotonic()
        while not admitted_everywhere() and time.monotonic() - seeded < RECOVERY_BOUND_S:
            time.sleep(0.01)
        back = time.monotonic() - seeded
        warned = [sum("lost its data" in line and "WARN" in line for line in g.log_text().splitlines())
                  for g in gateways]
        slowest = max(noticed.values()) if len(noticed) == 2 else None
        return [
            ("consumers, each with a key", f"{CONSUMERS}"),
            ("flush noticed by both instances after",
             f"{slowest * 1000:.0f} ms" if slowest is not None else f"> {RECOVERY_BOUND_S:.0f} s"),
            ("keys refused once noticed (sampled)", f"{refused} of {2 * len(keys[::10])}"),
            ("re-seeded from the listing in", f"{(seeded - seeding) * 1000:.0f} ms"),
            ("every key admitted on both after the re-seed", f"{back * 1000:.0f} ms"),
            ("WARN lines per instance", " / ".join(map(str, warned))),
        ]
    finally:
        for gateway in gateways:
            gateway.stop()
        redis.stop()


def descriptors(binary: Path, folder: Path) -> list[tuple[str, str]]:
    """One gateway with 64 descriptors (`prlimit --nofile=64:64`): idle connections are opened until one is left
    unanswered; meanwhile the admin listener is asked for /healthz; then the connections are closed."""
    if shutil.which("prlimit") is None:
        return [("descriptors exhausted", "prlimit not found")]
    gateway = Gateway(binary, folder, "descriptors", None, "deny", wrapper=["prlimit", "--nofile=64:64"],
                      extra="server:\n  header_read_timeout: 10m\n  keepalive_timeout: 10m\n")
    held = []
    try:
        waiting = None
        while len(held) < 200:
            stream = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
            stream.sendall(b"GET /steady HTTP/1.1\r\nHost: t\r\nx-key: k\r\n\r\n")
            stream.settimeout(0.5)
            try:
                answered = len(stream.recv(1024)) > 0
            except OSError:
                answered = False
            if not answered:
                waiting = stream
                break
            held.append(stream)
        if waiting is None:
            return [("descriptors exhausted", "never ran out")]
        exhausted = time.monotonic()
        answered = 0
        for _ in range(40):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{gateway.admin}/healthz", timeout=2) as response:
                    answered += response.status == 200
            except OSError:
                pass
            time.sleep(0.05)
        lasted = time.monotonic() - exhausted
        for stream in held:
            stream.close()
        freed = time.monotonic()
        waiting.settimeout(5)
        try:
            served = len(waiting.recv(1024)) > 0
        except OSError:
            served = False
        served_after = time.monotonic() - freed
        time.sleep(0.5)
        log = gateway.log_text()
        return [
            ("connections the gateway held before it ran out", f"{len(held)}"),
            (f"admin /healthz answered during {lasted:.1f} s out of descriptors", f"{answered} of 40"),
            ("log lines for the episode (start, end)",
             f"{log.count('out of file descriptors')}, {log.count('accepting connections again')}"),
            ("the waiting connection served after they were freed",
             f"{served_after * 1000:.0f} ms" if served else "never"),
        ]
    finally:
        for stream in held:
            stream.close()
        gateway.stop()


SLOTS_MAX = 4


class HoldingUpstream:
    """An HTTP upstream on a loopback port that holds every request to a path ending in /hold until `release`
    (others are answered at once), and counts the requests in flight: the most ever, and at each arrival."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        # (wall-clock time, requests in flight then) at each arrival
        self.arrivals: list[tuple[float, int]] = []
        self.released = threading.Event()
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                upstream.arrive()
                try:
                    if self.path.endswith("/hold"):
                        upstream.released.wait(120)
                    self.send_response(200)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the gateway went away first (the run is over)
                finally:
                    upstream.leave()

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def arrive(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.arrivals.append((time.time(), self.in_flight))

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()


def logged_at(line: str) -> float:
    """The wall-clock time a gateway's log line starts with (`2026-01-01T00:00:00.123456Z`)."""
    stamp = line.split()[0].rstrip("Z")
    return datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp()


def hold_slot(gateway: Gateway, key: str) -> None:
    """One request held at the upstream through `gateway` until released: its client waits as long (a client that
    gave up would free its slot, while the upstream still ran the request)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=120)
    try:
        connection.request("GET", "/slots/hold", headers={"x-key": key})
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass
    finally:
        connection.close()


def slots_redis_restarted(redis: Redis) -> None:
    redis.stop()
    shutil.rmtree(redis.folder, ignore_errors=True)
    redis.start()


def slots_redis_oom(redis: Redis) -> None:
    redis.cli("CONFIG", "SET", "maxmemory", "1")
    time.sleep(5)
    redis.cli("CONFIG", "SET", "maxmemory", "0")


SLOT_FAULTS = {
    "restarted": ("Redis restarted empty with slots held", "30s", slots_redis_restarted),
    "oom": ("Redis OOM (maxmemory tiny for 5 s) with slots held", "1s", slots_redis_oom),
}


def slots_held(binary: Path, folder: Path, on_error: str, name: str) -> list[tuple[str, str]]:
    """Gateway A holds SLOTS_MAX requests of one key at the upstream; gateway B asks for a slot every 20 ms while
    `fault` happens to Redis and 4 s after; then A's requests end."""
    label, lease, fault = SLOT_FAULTS[name]
    redis = Redis(free_port(), folder / f"slots-{name}-redis")
    redis.start()
    upstream = HoldingUpstream()
    gateways: list[Gateway] = []
    held: list[threading.Thread] = []
    try:
        extra = f'upstreams:\n  held: {{ targets: ["http://127.0.0.1:{upstream.port}"], timeout: 120s }}\n'
        routes = f"""  - name: slots
    match: {{ path_prefix: /slots }}
    upstream: held
    limits: [{{ name: in-flight, key: ["header:x-key"], algorithm: concurrency, max: {SLOTS_MAX}, lease: {lease} }}]
"""
        gateways = [Gateway(binary, folder, f"slots-{name}-{side}", redis.url(), on_error, extra=extra,
                            routes=routes) for side in ("a", "b")]
        a, b = gateways
        held = [threading.Thread(target=hold_slot, args=(a, "k"), daemon=True) for _ in range(SLOTS_MAX)]
        for thread in held:
            thread.start()
        deadline = time.monotonic() + 10
        while upstream.in_flight < SLOTS_MAX:
            if time.monotonic() > deadline:
                sys.exit(f"chaos: gateway A never held {SLOTS_MAX} slots")
            time.sleep(0.01)
        admitted: list[float] = []
        stop = threading.Event()

        def ask() -> None:
            until = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < until:
                if b.get("/slots/quick", "k") == 200:
                    admitted.append(time.time())
                time.sleep(0.02)

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        time.sleep(0.5)
        fault(redis)
        fixed = time.time()
        time.sleep(4)
        stop.set()
        asking.join()
        # From B's first reply of Redis after the fault (its "lost state" line): before it, `on_error` decided.
        back_at = next((logged_at(line) for line in b.log_text().splitlines() if "redis lost state" in line), fixed)
        still_held = upstream.in_flight
        most = upstream.most
        most_after = max([n for at, n in upstream.arrivals if at >= back_at] + [still_held])
        along = sum(at < back_at for at in admitted)
        upstream.released.set()
        for thread in held:
            thread.join(10)
        ended = time.monotonic()
        back = None
        while time.monotonic() - ended < RECOVERY_BOUND_S:
            if b.get("/slots/quick", "k") == 200:
                back = time.monotonic() - ended
                break
            time.sleep(0.01)
        warned = [sum("redis lost state" in line and "WARN" in line for line in g.log_text().splitlines())
                  for g in gateways]
        return [
            ("most in flight at the upstream, whole run (max 4)", f"{most}"),
            ("most in flight once B reached Redis again (max 4)", f"{most_after}"),
            ("admitted by B until it reached Redis again / after",
             f"{along} / {len(admitted) - along}"),
            ("lost state said (WARN lines, A / B)", " / ".join(map(str, warned))),
            ("B admitted again after A's requests ended",
             f"{back * 1000:.0f} ms" if back is not None else f"> {RECOVERY_BOUND_S:.0f} s"),
        ]
    finally:
        upstream.stop()
        for gateway in gateways:
            gateway.stop()
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=ROOT / "target/release/tollgate")
    parser.add_argument("--only", choices=["late-start", *FAULTS, "migration", "directory", "descriptors",
                                           "slots"])
    parser.add_argument("--on-error", choices=["local", "deny", "allow"], default="local",
                        help="the gateways' store.on_error (default local)")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            sys.exit(f"chaos: {tool} not found (scripts/test.sh installs it)")
    if not args.binary.exists():
        sys.exit(f"chaos: {args.binary} not found (cargo build --release)")

    folder = Path(tempfile.mkdtemp(prefix="tollgate-chaos-"))
    redis = Redis(free_port(), folder / "redis")
    rows = []
    gateways: list[Gateway] = []
    try:
        if args.only in ("migration", "directory", "descriptors", "slots"):
            raise NoOutage  # the standalone Redis's faults are not asked for
        # Redis not up when the gateways start: they must connect once it is, however late.
        tally = Tally()
        gateways = [Gateway(args.binary, folder, f"gateway{i}", redis.url(), args.on_error) for i in (1, 2)]
        stop = threading.Event()
        threads = steady_load(gateways, tally, stop)
        time.sleep(2)
        redis.start()
        since = time.monotonic()
        recovery = time_to_shared(gateways, tally, since)
        over = over_admitted(gateways, tally)
        stop.set()
        for thread in threads:
            thread.join()
        if args.only in (None, "late-start"):
            rows.append(("Redis not up when the gateways start", tally, over, counted_late(redis, tally), recovery))

        for name, fault in FAULTS.items():
            if args.only not in (None, name):
                continue
            label = fault[0]
            tally = Tally()
            stop = threading.Event()
            threads = steady_load(gateways, tally, stop)
            time.sleep(0.5)
            try:
                since = apply(fault, redis, gateways, tally)
                recovery = time_to_shared(gateways, tally, since)
            except NoOutage:
                recovery = "no outage"
            over = over_admitted(gateways, tally)
            if len(fault) > 3:
                time.sleep(WINDOW_S)  # a long outage: the windows that straddle its end, too
            stop.set()
            for thread in threads:
                thread.join()
            rows.append((label, tally, over, counted_late(redis, tally), recovery))
    except NoOutage:
        pass
    finally:
        for gateway in gateways:
            gateway.stop()
        redis.stop()
    if args.only in (None, "migration"):
        rows.append(slot_migration(args.binary, folder, args.on_error))
    figures = []
    if args.only in (None, "directory"):
        figures.append(("Consumer directory flushed, then re-seeded from its listing",
                        directory_flush(args.binary, folder)))
    if args.only in (None, "descriptors"):
        figures.append(("Out of file descriptors", descriptors(args.binary, folder)))
    if args.only in (None, "slots"):
        for name, (label, _, _) in SLOT_FAULTS.items():
            figures.append((f"{label} (two gateways, max {SLOTS_MAX}, on_error: {args.on_error})",
                            slots_held(args.binary, folder, args.on_error, name)))

    if rows:
        print(f"{'fault':<42} {'requests':>9} {'failed beyond policy':>21} {'over-admitted':>14} {'counted late':>13}"
              f" {'worst 10 s':>11} {'shared again after':>19}")
    for label, tally, over, late, recovery in rows:
        if isinstance(recovery, str):
            after = recovery
        elif recovery is None:
            after = f"> {RECOVERY_BOUND_S:.0f} s"
        else:
            after = f"{recovery * 1000:.0f} ms"
        print(f"{label:<42} {tally.total:>9} {tally.beyond_policy:>21} {over:>14} {late:>13} {tally.worst_windows():>11} {after:>19}")
    for title, lines in figures:
        print(f"\n{title}")
        for what, figure in lines:
            print(f"  {what:<62} {figure:>14}")
    print(f"(logs and configs in {folder})")


if __name__ == "__main__":
    main()
