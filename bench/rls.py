#!/usr/bin/env python3
"""Decisions per second and latency of Envoy's rate limit service (BENCHMARKS.md, "Envoy's rate limit service"):
a release tollgate serving only `rls:`, loaded by benches/rls_load.rs (a tonic client, one ShouldRateLimit call
per decision, concurrent HTTP/2 streams) on loopback, with the memory store and then Redis.

    python3 bench/rls.py                              # builds (release), 4 rows of 10 s each after 2 s warm-ups
    python3 bench/rls.py --duration 20 --concurrency 128 --connections 8
    python3 bench/rls.py --only redis                 # the Redis rows alone
    python3 bench/rls.py --debug --duration 2 --warmup 1   # a check that it all runs (debug builds, no figures)
    python3 bench/rls.py --binary /tmp/tollgate --load target/release/deps/rls_load-HASH   # builds nothing

tollgate and Redis run on CPU 0 (tollgate with TOKIO_WORKER_THREADS=1, RUST_LOG=warn), the load on CPU 1 with
one worker thread, as bench/run.sh places wrk. The limits admit everything (a sliding window, a GCRA and a token
bucket of a million a minute per client address), over 10,000 client addresses: what is measured is the cost of
a decision, not of refusals. Ports: 18091 (rls), 18093 and 19903 (tollgate's HTTP and admin listeners), 16389
(Redis); none of bench/run.sh's.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RLS_PORT = 18091
LISTEN_PORT = 18093
ADMIN_PORT = 19903
REDIS_PORT = 16389

DOMAIN = """rls:
  listen: 127.0.0.1:{rls}
  domains:
    bench:
      descriptors:
        - key: remote_address
          limits: [ {{ name: per-ip, algorithm: sliding_window, limit: 1000000, period: 1m }} ]
        - key: generic_key
          value: d1
          descriptors:
            - key: remote_address
              limits: [ {{ name: d1, algorithm: gcra, rate: 1000000/1m, burst: 1000 }} ]
        - key: generic_key
          value: d2
          descriptors:
            - key: remote_address
              limits: [ {{ name: d2, algorithm: token_bucket, rate: 1000000/1m, burst: 1000 }} ]
"""

STORES = {
    "memory": "store:\n  backend: memory\n",
    "redis": f"store:\n  backend: redis\n  url: redis://127.0.0.1:{REDIS_PORT}\n  on_error: deny\n",
}


def pinned(cpu, command):
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


def wait_port(port, within=60.0):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"rls: nothing listens on {port}")


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build(debug):
    """The tollgate binary and the load generator's executable, built for this run."""
    profile = [] if debug else ["--release"]
    subprocess.run(["cargo", "build", *profile, "--bin", "tollgate"], cwd=ROOT, check=True)
    # `cargo bench --no-run` builds the bench profile (release settings); `cargo build --bench` the dev one.
    command = ["cargo", "build", "--bench", "rls_load"] if debug else ["cargo", "bench", "--no-run", "--bench", "rls_load"]
    out = subprocess.run(
        [*command, "--message-format=json"], cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    load = None
    for line in out.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "rls_load":
            load = message.get("executable") or load
    if load is None:
        raise SystemExit("rls: no rls_load executable in cargo's output")
    tollgate = ROOT / "target" / ("debug" if debug else "release") / "tollgate"
    return tollgate, Path(load)


class Redis:
    def __init__(self, work):
        if not shutil.which("redis-server"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=True)
        self.process = subprocess.Popen(
            pinned(0, ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--dir", str(work)]),
            stdout=subprocess.DEVNULL,
        )
        wait_port(REDIS_PORT)

    def stop(self):
        self.process.terminate()
        self.process.wait()


def run_row(args, tollgate, load, work, store, descriptors):
    config = work / f"{store}.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{LISTEN_PORT}\nadmin: {{ listen: 127.0.0.1:{ADMIN_PORT} }}\n"
        + STORES[store]
        + DOMAIN.format(rls=RLS_PORT)
    )
    env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
    server = subprocess.Popen(
        pinned(0, [str(tollgate), "run", "--config", str(config)]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(work / "tollgate.log", "a"),
    )
    try:
        wait_port(RLS_PORT)
        before = cpu_seconds(server.pid)
        started = time.time()
        out = subprocess.run(
            pinned(1, [str(load), "--addr", f"127.0.0.1:{RLS_PORT}", "--duration", str(args.duration),
                       "--warmup", str(args.warmup), "--concurrency", str(args.concurrency),
                       "--connections", str(args.connections), "--keys", str(args.keys),
                       "--descriptors", str(descriptors), "--json"]),
            env=dict(os.environ, TOKIO_WORKER_THREADS="1"),
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
        elapsed = time.time() - started
        result = json.loads(out.strip().splitlines()[-1])
        result["tollgate_cpu"] = (cpu_seconds(server.pid) - before) / elapsed
        if result["errors"]:
            # Calls answered UNAVAILABLE (the store failed under on_error: deny): tollgate's log says why.
            log = (work / "tollgate.log").read_text().splitlines()
            print("rls: errors; tollgate's log ends:\n  " + "\n  ".join(log[-5:]), file=sys.stderr)
        return result
    finally:
        server.terminate()
        server.wait()
        if store == "redis":
            subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "flushall"], stdout=subprocess.DEVNULL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per row")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load before measuring")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent calls (HTTP/2 streams)")
    parser.add_argument("--connections", type=int, default=4, help="HTTP/2 connections they share")
    parser.add_argument("--keys", type=int, default=10000, help="distinct client addresses")
    parser.add_argument("--only", choices=sorted(STORES), help="one store's rows")
    parser.add_argument("--debug", action="store_true", help="debug builds: checks that it runs, no figures")
    parser.add_argument("--binary", type=Path, help="this tollgate (with --load: nothing is built)")
    parser.add_argument("--load", type=Path, help="this rls_load executable (from an earlier run's build)")
    args = parser.parse_args()

    if args.binary and args.load:
        tollgate, load = args.binary, args.load
    elif args.binary or args.load:
        raise SystemExit("rls: --binary and --load go together")
    else:
        tollgate, load = build(args.debug)
    print(f"rls: {tollgate}, load from {load}", file=sys.stderr)
    stores = [args.only] if args.only else ["memory", "redis"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tollgate-rls-bench-") as work:
        work = Path(work)
        redis = Redis(work) if "redis" in stores else None
        try:
            for store in stores:
                for descriptors in (1, 3):
                    result = run_row(args, tollgate, load, work, store, descriptors)
                    rows.append((store, descriptors, result))
                    print(f"rls: {store}, {descriptors} descriptor(s): {json.dumps(result)}", file=sys.stderr)
        finally:
            if redis:
                redis.stop()

    build_kind = "debug build: not figures" if args.debug else "release build"
    print(f"\nEnvoy's rate limit service, {args.concurrency} streams on {args.connections} connections, "
          f"{args.keys} client addresses, {args.duration} s after {args.warmup} s ({build_kind})\n")
    # The client, one tonic thread, may be what limits decisions/s: tollgate's CPU then stays under 100%, and
    # decisions per CPU-second of tollgate is what one of its cores would serve.
    print("| store | descriptors per call | decisions/s | p50 ms | p99 ms | over_limit | errors | tollgate CPU % "
          "| decisions per tollgate CPU-second |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for store, descriptors, r in rows:
        per_cpu_second = r['decisions_per_s'] / r['tollgate_cpu'] if r['tollgate_cpu'] else 0
        print(f"| {store} | {descriptors} | {r['decisions_per_s']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
              f"| {r['over_limit']} | {r['errors']} | {100 * r['tollgate_cpu']:.0f} | {per_cpu_second:,.0f} |")


if __name__ == "__main__":
    main()
