#!/usr/bin/env python3
"""HTTPS against nginx: keep-alive requests per second (HTTP/1.1 and HTTP/2, h2load) and new handshakes per second
(wrk with `Connection: close`), tollgate (limiting off) and nginx `proxy_pass` in front of the same upstream, one
worker each, the same ECDSA P-256 certificate, servers on CPU 0 and the load on CPU 1, rounds in mirrored order
(tollgate, nginx, nginx, tollgate). Both speak TLS 1.3 (nginx 1.22 stops at 1.2 unless told) and both resume
sessions by ticket, which wrk does when it reconnects. Needs h2load (nghttp2-client), wrk, nginx, openssl and a
release build.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_cost import (  # noqa: E402
    ADMIN_PORT, ROOT, TOLLGATE, TOLLGATE_PORT, UPSTREAM_PORT, bench_env, certificate, nginx_main, nginx_proxy_conf, wait_ready,
)

URL = f"https://127.0.0.1:{TOLLGATE_PORT}/"


def start(server: str, binary: Path, work: Path) -> subprocess.Popen:
    """The server under test on CPU 0: tollgate on bench/configs/tls-off.yaml, or nginx with the same certificate."""
    if server == "nginx":
        conf = nginx_proxy_conf(work, limit=False, tls=True)
        command, ready = ["nginx", "-p", str(conf.parent), "-c", str(conf)], URL
    else:
        command = [str(binary), "--config", str(ROOT / "bench/configs/tls-off.yaml")]
        ready = f"http://127.0.0.1:{ADMIN_PORT}/readyz"
    env = bench_env(TOKIO_WORKER_THREADS="1", RUST_LOG="warn", BENCH_TLS_DIR=str(work))
    process = subprocess.Popen(["taskset", "-c", "0", *command], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(ready, server, process)
    return process


def rate(kind: str, seconds: int) -> float:
    """One load of `kind` on CPU 1, in requests per second."""
    if kind == "handshakes":
        out = subprocess.run(
            ["taskset", "-c", "1", "wrk", "-t1", "-c32", f"-d{seconds}s", "-H", "Connection: close", URL],
            check=True, capture_output=True, text=True).stdout
        return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    protocol = ["--h1"] if kind == "http1" else ["-m", "10"]
    out = subprocess.run(
        ["taskset", "-c", "1", "h2load", "-D", str(seconds), "-c", "32", *protocol, URL],
        check=True, capture_output=True, text=True).stdout
    if not re.search(r"\d+ succeeded, 0 failed", out):
        sys.exit(f"tls.py: failed requests:\n{out}")
    return float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=TOLLGATE, help="the tollgate to measure")
    parser.add_argument("--seconds", type=int, default=10, help="length of each load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tls.") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        certificate(work)
        (work / "nginx.conf").write_text(
            f"""{nginx_main(work)}
http {{
    access_log off;
    keepalive_requests 10000000;
    server {{ listen 127.0.0.1:{UPSTREAM_PORT}; location / {{ return 200 "ok"; }} }}
}}
""")
        upstream = subprocess.Popen(["taskset", "-c", "0", "nginx", "-p", str(work), "-c", str(work / "nginx.conf")])
        results: dict[tuple[str, str], list[float]] = {}
        try:
            for server in ("tollgate", "nginx", "nginx", "tollgate"):
                process = start(server, args.binary, work)
                try:
                    for kind in ("http1", "http2", "handshakes"):
                        results.setdefault((server, kind), []).append(rate(kind, args.seconds))
                finally:
                    process.terminate()
                    process.wait()
        finally:
            upstream.terminate()
            upstream.wait()
        print(f"{args.binary}: HTTPS, limiting off, ECDSA P-256, one worker each, {args.seconds} s loads\n")
        print("| load | tollgate | nginx | tollgate / nginx |")
        print("|---|--:|--:|--:|")
        for kind, label in (("http1", "keep-alive HTTP/1.1 requests/s (h2load --h1, 32 connections)"),
                            ("http2", "keep-alive HTTP/2 requests/s (h2load, 32 connections, 10 streams each)"),
                            ("handshakes", "new connections/s (wrk, Connection: close)")):
            ours = sum(results[("tollgate", kind)]) / 2
            theirs = sum(results[("nginx", kind)]) / 2
            print(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
