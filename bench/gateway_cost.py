#!/usr/bin/env python3
"""Counts the instructions tollgate spends per proxied request under valgrind's callgrind, for the configurations
of bench/run.sh's targets 2, 5 and 3: limiting off, three limits on the memory store, the same three on Redis.

A count, not a time: it is the same from run to run on a noisy shared machine, where bench/run.sh's requests per
second move by 25% between identical runs, so it shows what a change to the request path costs or saves.

    cargo build --release && python3 bench/gateway_cost.py      # needs nginx, redis-server, valgrind
    python3 bench/gateway_cost.py --requests 6400 --connections 32
    python3 bench/gateway_cost.py --binary /tmp/tollgate-before     # another build, e.g. of an earlier commit

An nginx upstream (return 200) and a Redis are started on loopback; for each configuration tollgate runs under
callgrind with one worker thread (TOKIO_WORKER_THREADS=1, as in bench/run.sh), takes 200 warm-up requests, then
the counters are zeroed and REQUESTS requests are sent over CONNECTIONS keep-alive connections, each connection one
request at a time. The Redis case depends on how many requests share a script call: under callgrind every
connection's request is usually waiting by the time the previous call returns, so calls carry about CONNECTIONS
requests (under wrk's 64 connections they carry about 24). Ports: the ones of bench/run.sh (16379 Redis, 18081
upstream, 18090 and 19901 tollgate), so do not run both at once.
"""

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLLGATE = ROOT / "target/release/tollgate"
REDIS_PORT = 16379
UPSTREAM_PORT = 18081
TOLLGATE_PORT = 18090
ADMIN_PORT = 19901
CASES = [
    ("limiting off (target 2)", "off.yaml"),
    ("memory store, 3 limits (target 5)", "memory-pass.yaml"),
    ("Redis, 3 limits (target 3)", "redis-pass.yaml"),
]
REQUEST = f"GET /item HTTP/1.1\r\nHost: 127.0.0.1:{TOLLGATE_PORT}\r\nUser-Agent: gateway_cost\r\n\r\n".encode()


def wait_ready(url: str, what: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"gateway_cost: {what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"gateway_cost: {what} not ready within {seconds} s")


async def one_connection(count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", TOLLGATE_PORT)
    for _ in range(count):
        writer.write(REQUEST)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"gateway_cost: unexpected answer {head[:60]!r}")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if length:
            await reader.readexactly(length)
    writer.close()


def send(requests: int, connections: int) -> None:
    async def all_connections() -> None:
        await asyncio.gather(*(one_connection(requests // connections) for _ in range(connections)))

    asyncio.run(all_connections())


def total_instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    sys.exit(f"gateway_cost: no totals in {dump}")


def measure(binary: Path, config: Path, requests: int, connections: int, work: Path) -> float:
    env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
    env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{REDIS_PORT}"
    env["BENCH_UPSTREAM_URL"] = f"http://127.0.0.1:{UPSTREAM_PORT}"
    out = work / f"callgrind.{config.stem}"
    gateway = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", str(binary), "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{ADMIN_PORT}/readyz", "tollgate", gateway)
        send(200, min(connections, 8))
        subprocess.run(["callgrind_control", "--zero", str(gateway.pid)], check=True, capture_output=True)
        send(requests, connections)
        subprocess.run(["callgrind_control", "--dump", str(gateway.pid)], check=True, capture_output=True)
        dumps = sorted(work.glob(f"callgrind.{config.stem}.{gateway.pid}.*"))
        if not dumps:
            sys.exit("gateway_cost: callgrind wrote no dump")
        return total_instructions(dumps[-1]) / requests
    finally:
        gateway.terminate()
        gateway.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3200)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--binary", type=Path, default=TOLLGATE, help="the tollgate to measure")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"gateway_cost: {tool} not found (apt-get install valgrind nginx-light redis-server)")
    if not args.binary.exists():
        sys.exit(f"gateway_cost: no {args.binary}: build first (cargo build --release)")

    with tempfile.TemporaryDirectory(prefix="gateway_cost.") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        (work / "nginx.conf").write_text(
            f"""worker_processes 1;
daemon off;
master_process off;
pid {work}/nginx.pid;
error_log {work}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    server {{
        listen 127.0.0.1:{UPSTREAM_PORT};
        location / {{ return 200 "ok"; }}
    }}
}}
"""
        )
        upstream = subprocess.Popen(["nginx", "-p", str(work), "-c", str(work / "nginx.conf")])
        redis = subprocess.Popen(
            ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_ready(f"http://127.0.0.1:{UPSTREAM_PORT}/", "nginx", upstream, 10)
            print(
                f"{args.binary}: instructions per request ({args.requests} requests over {args.connections} "
                "connections, callgrind)"
            )
            print()
            print("| configuration | instructions per request |")
            print("|---|--:|")
            for label, name in CASES:
                subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "flushall"], capture_output=True)
                cost = measure(args.binary, ROOT / "bench/configs" / name, args.requests, args.connections, work)
                print(f"| {label} | {cost:,.0f} |", flush=True)
        finally:
            upstream.terminate()
            redis.terminate()
            upstream.wait()
            redis.wait()


if __name__ == "__main__":
    main()
