#!/usr/bin/env python3
"""Measures what tollgate costs as the work grows, and prints each case against the smallest one: costs that must
stay flat (BENCHMARKS.md, "Costs as the work grows").

    cargo build --release && python3 bench/flat.py          # needs wrk and nginx (installed when missing, as root)
    python3 bench/flat.py --quick                           # smaller sizes and shorter loads (about a minute)
    python3 bench/flat.py --only routes                     # one row: metrics, routes, consumers, connections
    python3 bench/flat.py --binary /tmp/tollgate-before     # another build, e.g. of an earlier commit

Rows:
- metrics: RSS while an upstream route is loaded and nobody scrapes /metrics, at each checkpoint of the load,
  and the bytes it grew per request since the first (histogram samples held until rendered grew it ~20 bytes per
  request; the recorder's own upkeep keeps it flat).
- routes: 1 to 10,000 prefix routes; requests per second to the last route (and to the first at the largest
  size), and RSS per route.
- consumers: a directory of 1 to 1,000,000 runtime consumers (in memory), loaded by one POST /consumers:import;
  the import's time, the time of one PUT /consumers/{id} at that size, and the requests per second of an API-key
  consumer quiet and while PUTs stream without pause.
- connections: RSS per idle keep-alive connection (each has sent one request) for growing numbers of them.

tollgate runs on CPU 0 with one worker thread (TOKIO_WORKER_THREADS=1), wrk on CPU 1, as in bench/run.sh; ratios
within one run are what to read on a shared machine, not the absolute figures. Ports: bench/run.sh's (18081
upstream, 18090 and 19901 tollgate), so do not run both at once.
"""

import argparse
import http.client
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_PORT = 18081
PORT = 18090
ADMIN_PORT = 19901


def sh(*args, **kwargs):
    return subprocess.run(args, check=True, **kwargs)


def install_missing():
    missing = [tool for tool in ("wrk", "nginx", "taskset") if not shutil.which(tool)]
    if not missing:
        return
    packages = {"wrk": "wrk", "nginx": "nginx-light", "taskset": "util-linux"}
    print(f"flat: installing {' '.join(missing)}", file=sys.stderr)
    sh("apt-get", "update", "-qq")
    sh("apt-get", "install", "-y", "-qq", *(packages[tool] for tool in missing))


def wait_port(port, within=20.0):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"flat: nothing listens on {port}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Upstream:
    """nginx answering 200 on UPSTREAM_PORT, on CPU 0 with the gateway."""

    def __init__(self, work):
        conf = work / "nginx.conf"
        conf.write_text(
            f"""daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/nginx.err;
events {{ worker_connections 4096; }}
http {{ access_log off; server {{ listen 127.0.0.1:{UPSTREAM_PORT}; keepalive_requests 1000000;
  location / {{ return 200 "ok"; }} }} }}
"""
        )
        self.process = subprocess.Popen(["taskset", "-c", "0", "nginx", "-c", str(conf), "-p", str(work)])
        wait_port(UPSTREAM_PORT)

    def stop(self):
        self.process.terminate()
        self.process.wait()


class Gateway:
    """tollgate on `yaml`, one worker thread on CPU 0."""

    def __init__(self, binary, work, yaml):
        config = work / "gateway.yaml"
        config.write_text(yaml)
        env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", str(binary), "--config", str(config), "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "tollgate.log", "a"),
        )
        wait_port(PORT, within=120)
        wait_port(ADMIN_PORT)

    def rss(self):
        return rss_kib(self.process.pid)

    def stop(self):
        self.process.terminate()
        self.process.wait()


def head(extra=""):
    return f"""listen: 127.0.0.1:{PORT}
admin:
  listen: 127.0.0.1:{ADMIN_PORT}
store:
  backend: memory
server:
  header_read_timeout: 120s
  keepalive_timeout: 600s
{extra}"""


def wrk(url, seconds, connections=32, headers=()):
    args = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    for header in headers:
        args += ["-H", header]
    out = subprocess.run(args + [url], check=True, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return rps, requests


def table(title, header, rows):
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    sys.stdout.flush()


def ratio(value, base):
    return f"{value / base:.2f}×" if base else "-"


# === rows ===


def metrics_row(binary, work, quick):
    yaml = head(
        f"""upstreams:
  origin:
    targets: ["http://127.0.0.1:{UPSTREAM_PORT}"]
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: origin
"""
    )
    gateway = Gateway(binary, work, yaml)
    seconds = 5 if quick else 15
    try:
        wrk(f"http://127.0.0.1:{PORT}/", 2)  # warm-up: pools, allocator arenas
        rows, served, first = [], 0, None
        for checkpoint in range(4):
            _, requests = wrk(f"http://127.0.0.1:{PORT}/", seconds)
            served += requests
            rss = gateway.rss()
            if first is None:
                first = (served, rss)
            grown = (rss - first[1]) * 1024 / max(served - first[0], 1) if checkpoint else 0.0
            rows.append((f"{served:,}", f"{rss / 1024:.1f}", ratio(rss, first[1]), f"{grown:.2f}"))
    finally:
        gateway.stop()
    table(
        "metrics: RSS while nobody scrapes /metrics",
        ["requests served", "RSS MiB", "RSS vs first", "bytes grown per request since first"],
        rows,
    )


def routes_yaml(count):
    routes = "".join(
        f"  - name: r{i}\n    match: {{ path_prefix: /r{i} }}\n    respond: {{ status: 200, body: \"ok\" }}\n"
        for i in range(count)
    )
    return head("routes:\n" + routes)


def routes_row(binary, work, quick):
    sizes = [1, 100, 1000] if quick else [1, 100, 1000, 10000]
    seconds = 3 if quick else 8
    rows, base_rps, base_rss = [], None, None
    for count in sizes:
        gateway = Gateway(binary, work, routes_yaml(count))
        try:
            rss = gateway.rss()
            wrk(f"http://127.0.0.1:{PORT}/r{count - 1}/x", 1)
            last, _ = wrk(f"http://127.0.0.1:{PORT}/r{count - 1}/x", seconds)
            first, _ = wrk(f"http://127.0.0.1:{PORT}/r0/x", seconds) if count == sizes[-1] else (None, 0)
        finally:
            gateway.stop()
        if base_rps is None:
            base_rps, base_rss = last, rss
        per_route = (rss - base_rss) * 1024 / (count - 1) if count > 1 else 0
        rows.append(
            (
                f"{count:,}",
                f"{last:,.0f}",
                ratio(last, base_rps),
                f"{first:,.0f} ({ratio(last, first)} of it)" if first else "",
                f"{rss / 1024:.1f}",
                f"{per_route / 1024:.1f}" if count > 1 else "",
            )
        )
    table(
        "routes: requests to the last route, and memory per route",
        ["routes", "last route rps", "vs 1 route", "first route rps (last ÷ first)", "RSS MiB", "KiB per route"],
        rows,
    )


def consumers_yaml():
    return head(
        """routes:
  - name: api
    match: { path_prefix: / }
    respond: { status: 200, body: "ok" }
    consumers: required
consumers:
  identify:
    - api_key: { header: x-api-key }
  keys:
    - { key: "sha256:b0962662e937d44c699c8305d90cbf190b3150c59b13863d1380b5cc3c711bb7", consumer: user-0, plan: free }   # bench-key
  plans:
    free:
      limits:
        - { name: hourly, key: consumer, algorithm: fixed_window, limit: 1000000000, period: 1s }
    pro:
      limits:
        - { name: hourly, key: consumer, algorithm: fixed_window, limit: 1000000000, period: 1s }
"""
    )


def admin_call(connection, method, path, body):
    connection.request(method, path, body=body, headers={"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"flat: {method} {path}: {response.status} {data[:200]!r}")
    return data


def stream_changes(size, stop, counter):
    """PUTs to consumers of a directory of `size` until `stop` is set; counts them in `counter`."""
    admin = http.client.HTTPConnection("127.0.0.1", ADMIN_PORT, timeout=60)
    i = 0
    while not stop.is_set():
        plan = "pro" if i % 2 == 0 else "free"
        admin_call(admin, "PUT", f"/consumers/user-{i * 7919 % size}", f'{{"plan":"{plan}"}}')
        i += 1
    counter.append(i)


def consumers_row(binary, work, quick):
    sizes = [1, 10_000, 100_000] if quick else [1, 10_000, 100_000, 1_000_000]
    changes = 200
    seconds = 3 if quick else 6
    key = ["x-api-key: bench-key"]
    rows, base = [], None
    for size in sizes:
        gateway = Gateway(binary, work, consumers_yaml())
        try:
            body = "".join(
                f'{{"consumer":"user-{i}","record":{{"plan":"free"}}}}\n' for i in range(size)
            ).encode()
            admin = http.client.HTTPConnection("127.0.0.1", ADMIN_PORT, timeout=300)
            started = time.perf_counter()
            admin_call(admin, "POST", "/consumers:import", body)
            imported = time.perf_counter() - started
            started = time.perf_counter()
            for i in range(changes):
                plan = "pro" if i % 2 == 0 else "free"
                admin_call(admin, "PUT", f"/consumers/user-{i * 7919 % size}", f'{{"plan":"{plan}"}}')
            per_change = (time.perf_counter() - started) / changes
            url = f"http://127.0.0.1:{PORT}/x"
            wrk(url, 1, headers=key)
            quiet, _ = wrk(url, seconds, headers=key)
            stop, counter = threading.Event(), []
            streamer = threading.Thread(target=stream_changes, args=(size, stop, counter))
            streamer.start()
            busy, _ = wrk(url, seconds, headers=key)
            stop.set()
            streamer.join()
            rss = gateway.rss()
        finally:
            gateway.stop()
        if base is None:
            base = (per_change, quiet)
        rows.append(
            (
                f"{size:,}",
                f"{imported:.2f}",
                f"{per_change * 1e3:.3f}",
                ratio(per_change, base[0]),
                f"{quiet:,.0f}",
                f"{busy:,.0f} ({counter[0] / seconds:,.0f} changes/s)",
                ratio(busy, quiet),
                f"{rss / 1024:.1f}",
            )
        )
    table(
        "consumers: a runtime directory of growing size (memory store)",
        [
            "consumers",
            "import s",
            "ms per change (PUT)",
            "change vs 1 consumer",
            "rps",
            "rps while changes stream",
            "streaming ÷ quiet",
            "RSS MiB",
        ],
        rows,
    )


def connections_row(binary, work, quick):
    sizes = [500, 2000] if quick else [1000, 5000, 10000]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, sizes[-1] + 500)), hard))
    rows, base = [], None
    request = b"GET /x HTTP/1.1\r\nHost: bench\r\n\r\n"
    for count in sizes:
        gateway = Gateway(binary, work, routes_yaml(1).replace("/r0", "/"))
        sockets = []
        try:
            # One warm connection first, so that the figure is the connections' and not the first request's.
            warm = socket.create_connection(("127.0.0.1", PORT))
            warm.sendall(request)
            warm.recv(4096)
            time.sleep(0.5)
            before = gateway.rss()
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", PORT))
                s.sendall(request)
                sockets.append(s)
            for s in sockets:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"ok"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            # Idle past the second after which a connection rests without hyper's buffers (docs/operations.md).
            time.sleep(2.5)
            after = gateway.rss()
        finally:
            for s in sockets:
                s.close()
            gateway.stop()
        per_connection = (after - before) * 1024 / count
        if base is None:
            base = per_connection
        rows.append((f"{count:,}", f"{per_connection / 1024:.1f}", ratio(per_connection, base)))
    table(
        "connections: RSS per idle keep-alive connection (each served one request)",
        ["idle connections", "KiB each", "vs smallest"],
        rows,
    )


ROWS = {
    "metrics": metrics_row,
    "routes": routes_row,
    "consumers": consumers_row,
    "connections": connections_row,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, default=ROOT / "target/release/tollgate")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter loads")
    parser.add_argument("--only", choices=sorted(ROWS), action="append")
    args = parser.parse_args()
    if not args.binary.exists():
        raise SystemExit(f"flat: no {args.binary} (cargo build --release)")
    install_missing()
    # The script's own work (the admin calls, the idle sockets) beside wrk on CPU 1, off the gateway's core.
    os.sched_setaffinity(0, {1})
    print(f"flat: {args.binary}{' (quick)' if args.quick else ''}")
    with tempfile.TemporaryDirectory(prefix="tollgate-flat-") as work:
        work = Path(work)
        upstream = Upstream(work)
        try:
            for name in args.only or list(ROWS):
                ROWS[name](args.binary, work, args.quick)
        finally:
            upstream.stop()


if __name__ == "__main__":
    main()
