#!/usr/bin/env python3
"""Counts the instructions tollgate spends per proxied request under valgrind's callgrind, for the configurations
of bench/run.sh's targets 2, 5 and 3: limiting off, three limits on the memory store, the same three on Redis.

A count, not a time: it is the same from run to run on a noisy shared machine, where bench/run.sh's requests per
second move by 25% between identical runs, so it shows what a change to the request path costs or saves.

    cargo build --release && python3 bench/gateway_cost.py      # needs nginx, redis-server, valgrind, wrk
    python3 bench/gateway_cost.py --seconds 20 --connections 32
    python3 bench/gateway_cost.py --binary /tmp/tollgate-before     # another build, e.g. of an earlier commit
    python3 bench/gateway_cost.py --top 25      # also the cost by crate and the 25 heaviest functions themselves
    python3 bench/gateway_cost.py --cache       # also the instruction-cache misses per request (slower)
    python3 bench/gateway_cost.py --only redis-pass --keep /tmp/cg   # one configuration; keep its callgrind dump
    python3 bench/gateway_cost.py --only memory-keys    # 10,000 clients (bench/report.lua), not run by default
    python3 bench/gateway_cost.py --only memory-consumer   # an API-key consumer on a plan (memory-header: the
                                                           # same limits keyed by the key's header)
    python3 bench/gateway_cost.py --only memory-jwt        # a JWT consumer on the same plan (token cached)
    python3 bench/gateway_cost.py --only llm      # a token route (JSON, SSE of 1 and 64 KB) against one limit
    python3 bench/gateway_cost.py --only concurrency   # a concurrency limit against one limit, both stores
    python3 bench/gateway_cost.py --jwt                    # print the bench token (for bench/pairs.sh)
    python3 bench/gateway_cost.py --only nginx     # tollgate against nginx in this same harness, and the ratios
    python3 bench/gateway_cost.py --idle 1000      # also the memory an idle keep-alive connection holds, both
    python3 bench/gateway_cost.py --only memory-keys --look   # someone looking at the top keys: admissions counted

nginx is measured as tollgate is: the same upstream, the same wrk load, one worker (`worker_processes 1`,
`master_process off`) under callgrind: `proxy_pass` against tollgate with limiting off, and `limit_req` (a zone
that rejects nothing) against tollgate with one Redis `gcra` limit. The table ends with the two ratios.

An nginx upstream (return 200) and a Redis are started on loopback; for each configuration tollgate runs under
callgrind with one worker thread (TOKIO_WORKER_THREADS=1, as in bench/run.sh), takes a 3 s warm-up from wrk, then
the counters are zeroed and wrk loads it for SECONDS over CONNECTIONS keep-alive connections; the instructions are
divided by the requests wrk completed. The Redis case depends on how many requests share a script call, which
depends on timing: the table gives it (from Redis's `INFO commandstats`), and two builds compare fairly only at
similar batch sizes. Under callgrind, 32 connections give calls of about 15 requests, near the 24 of bench/run.sh's
64 connections at full speed (64 under callgrind give over 50). Ports: the ones of
bench/run.sh (16379 Redis, 18081 upstream, 18090 and 19901 tollgate), so do not run both at once, or move this
script's with BENCH_PORT_OFFSET=1000.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLLGATE = ROOT / "target/release/tollgate"
# BENCH_PORT_OFFSET moves every port by that much, so that two checkouts can measure at once (a helper's worktree
# and the lead's): their servers would otherwise answer each other's load.
PORT_OFFSET = int(os.environ.get("BENCH_PORT_OFFSET", "0"))
REDIS_PORT = 16379 + PORT_OFFSET
UPSTREAM_PORT = 18081 + PORT_OFFSET
TOLLGATE_PORT = 18090 + PORT_OFFSET
ADMIN_PORT = 19901 + PORT_OFFSET


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of a server under test: where its Redis, upstream and listeners are (bench/configs read
    BENCH_REDIS_URL, BENCH_UPSTREAM_URL, BENCH_LISTEN and BENCH_ADMIN)."""
    return dict(os.environ, BENCH_REDIS_URL=f"redis://127.0.0.1:{REDIS_PORT}",
                BENCH_UPSTREAM_URL=f"http://127.0.0.1:{UPSTREAM_PORT}", BENCH_LISTEN=f"127.0.0.1:{TOLLGATE_PORT}",
                BENCH_ADMIN=f"127.0.0.1:{ADMIN_PORT}", **extra)
# The API key of the consumer configurations (bench/configs/*-consumer.yaml list its SHA-256).
API_KEY = ["x-api-key: bench-key"]
# The HS256 secret of bench/configs/*-jwt.yaml (read from BENCH_JWT_SECRET).
JWT_SECRET = os.environ.get("BENCH_JWT_SECRET", "bench-secret-of-at-least-32-bytes")


def jwt(seconds: int = 86_400) -> str:
    """An HS256 token for consumer `bench` on plan `bench`, valid for `seconds`, signed with JWT_SECRET."""
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    header = part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = part(json.dumps({"sub": "bench", "plan": "bench", "exp": int(time.time()) + seconds}).encode())
    signature = hmac.new(JWT_SECRET.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{part(signature)}"


BEARER = [f"authorization: Bearer {jwt()}"]
# A chat completion request (OpenAI's format) as a token route reads it: 64 tokens of completion asked for.
CHAT = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 64}
# What each case sends: a path, and the JSON body of a POST (None: a GET). The upstream answers /v1/json/ with a
# chat completion, /v1/sse1k/ and /v1/sse64k/ with a streamed one of about 1 and 64 KB (usage in its last event).
REQUESTS = {
    "get": ("/item", None),
    "json": ("/v1/json/chat/completions", CHAT),
    "sse1k": ("/v1/sse1k/chat/completions", dict(CHAT, stream=True, stream_options={"include_usage": True})),
    "sse64k": ("/v1/sse64k/chat/completions", dict(CHAT, stream=True, stream_options={"include_usage": True})),
}
# label, name (for --only), config, distinct clients (None: one), measured by default, request headers, request
CASES = [
    ("limiting off (target 2)", "off", "off", None, True, [], "get"),
    ("memory store, 3 limits (target 5)", "memory-pass", "memory-pass", None, True, [], "get"),
    ("Redis, 3 limits (target 3)", "redis-pass", "redis-pass", None, True, [], "get"),
    ("memory store, 3 limits, 10,000 clients", "memory-keys", "memory-keys", 10_000, False, [], "get"),
    ("Redis, 3 limits, 10,000 clients (target 3k)", "redis-keys", "redis-keys", 10_000, False, [], "get"),
    ("memory store, 3 limits keyed by a header", "memory-header", "memory-header", None, False, API_KEY, "get"),
    ("memory store, API-key consumer, plan of 3 limits", "memory-consumer", "memory-consumer", None, False, API_KEY, "get"),
    ("Redis, 3 limits keyed by a header", "redis-header", "redis-header", None, False, API_KEY, "get"),
    ("Redis, API-key consumer, plan of 3 limits", "redis-consumer", "redis-consumer", None, False, API_KEY, "get"),
    ("memory store, JWT consumer, plan of 3 limits", "memory-jwt", "memory-jwt", None, False, BEARER, "get"),
    ("Redis, JWT consumer, plan of 3 limits", "redis-jwt", "redis-jwt", None, False, BEARER, "get"),
    # --only llm: a token route against the same route counting requests, for a JSON answer and SSE of two sizes
    ("memory store, 1 limit, chat JSON", "memory-one-json", "memory-one", None, False, [], "json"),
    ("memory store, token route, chat JSON", "memory-tokens-json", "memory-tokens", None, False, [], "json"),
    ("memory store, 1 limit, chat SSE 1 KB", "memory-one-sse1k", "memory-one", None, False, [], "sse1k"),
    ("memory store, token route, chat SSE 1 KB", "memory-tokens-sse1k", "memory-tokens", None, False, [], "sse1k"),
    ("memory store, 1 limit, chat SSE 64 KB", "memory-one-sse64k", "memory-one", None, False, [], "sse64k"),
    ("memory store, token route, chat SSE 64 KB", "memory-tokens-sse64k", "memory-tokens", None, False, [], "sse64k"),
    ("Redis, 1 limit, chat JSON", "redis-one-json", "redis-one", None, False, [], "json"),
    ("Redis, token route, chat JSON", "redis-tokens-json", "redis-tokens", None, False, [], "json"),
    # --only concurrency: a concurrency limit against one limit of requests
    ("memory store, 1 limit", "memory-one", "memory-one", None, False, [], "get"),
    ("memory store, 1 concurrency limit", "memory-concurrency", "memory-concurrency", None, False, [], "get"),
    ("Redis, 1 limit", "redis-one", "redis-one", None, False, [], "get"),
    ("Redis, 1 concurrency limit", "redis-concurrency", "redis-concurrency", None, False, [], "get"),
    # --only telemetry: limiting off with traces sampled at 1 in 10 and at every request, and with the access log
    ("limiting off, traces sampled 1 in 10", "traces-tenth", "traces-tenth", None, False, [], "get"),
    ("limiting off, traces of every request", "traces-all", "traces-all", None, False, [], "get"),
    ("limiting off, access log (JSON)", "access-log", "off", None, False, [], "get"),
    # --only tls: HTTPS on both, one ECDSA P-256 certificate made for the run, keep-alive connections
    ("HTTPS, limiting off", "tls-off", "tls-off", None, False, [], "get"),
    ("nginx proxy_pass over HTTPS", "nginx-tls", "nginx-tls", None, False, [], "get"),
    # nginx in the same harness (bench/run.sh's proxies), against which the first and the last tollgate rows are read
    ("Redis, 1 gcra limit", "redis-gcra", "redis-gcra", None, True, [], "get"),
    ("nginx proxy_pass", "nginx-pass", "nginx-pass", None, True, [], "get"),
    ("nginx proxy_pass with limit_req", "nginx-limit", "nginx-limit", None, True, [], "get"),
]
# The ratios printed under the table: (tollgate's case, nginx's case, what is compared).
RATIOS = [
    ("off", "nginx-pass", "limiting off / nginx proxy_pass"),
    ("redis-gcra", "nginx-limit", "one Redis gcra limit / nginx limit_req"),
    ("tls-off", "nginx-tls", "HTTPS, limiting off / nginx proxy_pass over HTTPS"),
]
# Names --only takes for several cases at once.
GROUPS = {
    "llm": [case[1] for case in CASES if case[6] != "get"],
    "concurrency": ["memory-one", "memory-concurrency", "redis-one", "redis-concurrency"],
    "nginx": ["off", "redis-gcra", "nginx-pass", "nginx-limit"],
    "telemetry": ["off", "traces-tenth", "traces-all", "access-log"],
    "tls": ["off", "nginx-pass", "tls-off", "nginx-tls"],
}
# Cases run with more than the warnings logged (their lines go to /dev/null, formatted all the same).
LOGGED = {"access-log": ["--log-format", "json"]}


def nginx_main(folder: Path) -> str:
    """The main context of an nginx.conf living in `folder`: one worker in the foreground, no master process (so
    that callgrind follows the process that serves)."""
    return f"""worker_processes 1;
daemon off;
master_process off;
pid {folder}/nginx.pid;
error_log {folder}/logs/error.log warn;
events {{ worker_connections 4096; }}"""


def nginx_proxy_conf(work: Path, limit: bool, tls: bool = False) -> Path:
    """An nginx proxy on tollgate's port in front of the same upstream, one worker, as bench/run.sh's: keep-alive
    towards the upstream, X-Forwarded-For added (as tollgate adds it), with `limit` a limit_req zone keyed by
    the client address that rejects nothing, and with `tls` HTTPS with the run's certificate (see `certificate`)."""
    name = "nginx-tls" if tls else "nginx-limit" if limit else "nginx-pass"
    folder = work / name
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    limit_req = "limit_req zone=pass burst=1000000 nodelay;" if limit else ""
    conf = folder / "nginx.conf"
    conf.write_text(
        f"""{nginx_main(folder)}
http {{
    access_log off;
    keepalive_requests 10000000;
    upstream origin {{
        server 127.0.0.1:{UPSTREAM_PORT};
        keepalive 256;
    }}
    limit_req_zone $binary_remote_addr zone=pass:10m rate=1000000r/s;
    limit_req_status 429;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    server {{
        listen 127.0.0.1:{TOLLGATE_PORT} backlog=4096{" ssl http2" if tls else ""};
        {f"ssl_certificate {work}/cert.pem; ssl_certificate_key {work}/key.pem; ssl_protocols TLSv1.2 TLSv1.3;" if tls else ""}
        location / {{ {limit_req} proxy_pass http://origin; }}
    }}
}}
"""
    )
    return conf


def chat_completion() -> dict:
    """An OpenAI chat completion answer with its usage (less than the bench request reserves: settled down)."""
    return {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32},
    }


def chat_stream(size: int) -> str:
    """A streamed chat completion (server-sent events) of about `size` bytes: content chunks, then the usage chunk
    that `stream_options.include_usage` asks for, then `[DONE]`."""
    chunk = json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
        "choices": [{"index": 0, "delta": {"content": "token " * 8}, "finish_reason": None}],
    })
    events = []
    while sum(len(event) for event in events) < size:
        events.append(f"data: {chunk}\n\n")
    usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
             "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}}
    return "".join(events) + f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"


def wait_ready(url: str, what: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"gateway_cost: {what} exited with {process.returncode}")
        try:
            # The HTTPS cases serve a certificate made for the run, trusted by no one.
            context = ssl._create_unverified_context() if url.startswith("https") else None
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"gateway_cost: {what} not ready within {seconds} s")


def load(
    seconds: int, connections: int, clients: int | None, headers: list[str], request: str, work: Path,
    scheme: str = "http",
) -> int:
    """Runs wrk against tollgate; returns the requests it completed. wrk keeps tollgate (slowed down 50 times by
    callgrind) saturated, as under bench/run.sh, so that the count includes the work a busy event loop shares
    between requests and not that of an idle one waking for each."""
    # With clients, bench/report.lua gives every request one of that many x-client values.
    script = ["-s", str(ROOT / "bench/report.lua")] if clients else []
    env = dict(os.environ, BENCH_KEYS=str(clients)) if clients else None
    path, body = REQUESTS[request]
    if body is not None:
        post = work / f"post-{request}.lua"
        post.write_text(
            f'wrk.method = "POST"\nwrk.body = [[{json.dumps(body)}]]\nwrk.headers["Content-Type"] = "application/json"\n'
        )
        script = ["-s", str(post)]
    header_args = [arg for header in headers or [] for arg in ("-H", header)]
    out = subprocess.run(
        ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s", *script, *header_args,
         f"{scheme}://127.0.0.1:{TOLLGATE_PORT}{path}"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if "Non-2xx" in out:
        sys.exit(f"gateway_cost: answers other than 2xx, the figure would not be of proxied requests:\n{out}")
    for line in out.splitlines():
        if "requests in" in line:
            return int(line.split()[0])
    sys.exit(f"gateway_cost: no request count in wrk's output:\n{out}")


def self_costs(dump: Path) -> dict[str, int]:
    """Instructions executed in each function itself (callees excluded), from a callgrind dump."""
    names: dict[str, str] = {}
    costs: dict[str, int] = {}
    function = None
    after_call = False
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("fn=", "cfn=")):
            # `fn=(12) name` defines id 12, later lines say `fn=(12)`.
            ident, _, name = line.split("=", 1)[1].partition(" ")
            if name:
                names[ident] = name
            if line.startswith("fn="):
                function = ident
        elif line.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            elif function is not None:
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    costs[function] = costs.get(function, 0) + int(fields[1])
    return {names.get(ident, ident): cost for ident, cost in costs.items()}


def instructions(dump: Path) -> tuple[int, int]:
    """All instructions of the dump, and those executed in libc's memcpy/memmove.

    The second is reported apart because callgrind counts every iteration of `rep movsb`, the way glibc copies
    large blocks, as an instruction: copies weigh far more in the count than in time (a 7 KiB copy counts like
    thousands of instructions and takes about 100 ns)."""
    costs = self_costs(dump)
    copies = sum(cost for name, cost in costs.items() if "memcpy" in name or "memmove" in name)
    return sum(costs.values()), copies


def instruction_cache_misses(dump: Path) -> int:
    """Level-1 instruction-cache misses of the whole dump, from its `events:` and `summary:` lines (present when
    callgrind ran with --cache-sim=yes, which simulates the caches of the machine it runs on)."""
    events: list[str] = []
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:") and "I1mr" in events:
            return int(line.split()[1:][events.index("I1mr")])
    sys.exit(f"gateway_cost: no I1mr count in {dump} (was callgrind run with --cache-sim=yes?)")


def script_calls() -> int:
    """`EVALSHA` calls Redis has served so far."""
    stats = subprocess.run(
        ["redis-cli", "-p", str(REDIS_PORT), "info", "commandstats"], capture_output=True, text=True
    ).stdout
    for line in stats.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


def check_usage_read(connections: int) -> None:
    """Exits unless the token route read the usage of every answer it sent whole (else the figure leaves out the
    settling). wrk stops with a request in flight on each connection, twice (the warm-up and the measured run): a
    request whose client left before its answer is settled at its reservation and counted missing, so up to two per
    connection are."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    counted = any(line.startswith("tollgate_tokens_total") for line in metrics.splitlines())
    missing = [line for line in metrics.splitlines() if line.startswith("tollgate_usage_missing_total")]
    cut = sum(float(line.rsplit(" ", 1)[1]) for line in missing)
    if not counted or cut > 2 * connections:
        sys.exit(f"gateway_cost: the token route did not read every answer's usage: {missing or 'no tokens counted'}")


def crate_of(function: str) -> str:
    """The crate a function's name starts with (`<hyper::…> as …` counts for hyper), or a C library's symbol."""
    name = function.lstrip("<&*")
    if "::" in name:
        return name.split("::", 1)[0].split("<", 1)[0]
    if name.startswith(("mi_", "_mi_")):
        return "mimalloc"
    if "memcpy" in name or "memmove" in name:
        return "memcpy/memmove"
    return "other (libc, kernel entry, unnamed)"


def heaviest(dump: Path, requests: int, count: int) -> list[tuple[str, float]]:
    """The `count` functions with the most instructions of their own, per request, after the same by crate."""
    costs = self_costs(dump)
    crates: dict[str, int] = {}
    for name, cost in costs.items():
        crates[crate_of(name)] = crates.get(crate_of(name), 0) + cost
    by_crate = sorted(crates.items(), key=lambda item: item[1], reverse=True)[:12]
    by_function = sorted(costs.items(), key=lambda item: item[1], reverse=True)[:count]
    return [(f"[crate] {name}", cost / requests) for name, cost in by_crate] + [
        (name, cost / requests) for name, cost in by_function
    ]


def certificate(work: Path) -> None:
    """An ECDSA P-256 certificate for 127.0.0.1 in `work` (cert.pem, key.pem), served by both HTTPS cases."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(work / "key.pem"), "-out", str(work / "cert.pem"), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )


def server_command(binary: Path, config: Path, work: Path) -> tuple[list[str], str]:
    """The command line of the server a case measures, and the URL that answers 200 once it is ready."""
    if config.stem.startswith("nginx-"):
        conf = nginx_proxy_conf(work, limit=config.stem == "nginx-limit", tls=config.stem == "nginx-tls")
        scheme = "https" if config.stem == "nginx-tls" else "http"
        return ["nginx", "-p", str(conf.parent), "-c", str(conf)], f"{scheme}://127.0.0.1:{TOLLGATE_PORT}/"
    return [str(binary), "--config", str(config)], f"http://127.0.0.1:{ADMIN_PORT}/readyz"


def idle_memory(binary: Path, config: Path, work: Path, connections: int) -> float:
    """The memory (VmRSS, bytes) one idle keep-alive connection holds: the server's RSS with `connections` open
    after one request each, less its RSS before they opened, divided by their number. Not under callgrind."""
    import socket

    command, ready = server_command(binary, config, work)
    env = bench_env(TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss() -> int:
        for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    sockets = []
    try:
        wait_ready(ready, "server", server)
        # Warm the server up with the same requests on connections that then close, so that what it allocates
        # once (pools, buffers of the first request) is not counted per connection.
        for _ in range(50):
            urllib.request.urlopen(f"http://127.0.0.1:{TOLLGATE_PORT}/item", timeout=10).read()
        time.sleep(0.5)
        before = rss()
        request = f"GET /item HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", TOLLGATE_PORT))
            sock.sendall(request)
            sockets.append(sock)
        for sock in sockets:
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(4096)
        # tollgate lets a connection rest with its socket alone after a second without a request: count that.
        time.sleep(2.5)
        return (rss() - before) / connections
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait()


def measure(
    binary: Path, config: Path, seconds: int, connections: int, work: Path, top: int, cache: bool,
    keep: Path | None, clients: int | None, headers: list[str], request: str, case: str = "", look: bool = False,
) -> tuple[float, float, float, float, list[tuple[str, float]]]:
    env = bench_env(TOKIO_WORKER_THREADS="1", RUST_LOG="info" if case in LOGGED else "warn")
    env["BENCH_JWT_SECRET"] = JWT_SECRET
    env["BENCH_TLS_DIR"] = str(work)
    out = work / f"callgrind.{config.stem}"
    simulate = ["--cache-sim=yes"] if cache else []
    nginx = config.stem.startswith("nginx-")
    command, ready = server_command(binary, config, work)
    command += LOGGED.get(case, [])
    gateway = subprocess.Popen(
        ["valgrind", "--tool=callgrind", *simulate, f"--callgrind-out-file={out}.%p", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(ready, "nginx" if nginx else "tollgate", gateway)
        if look and not nginx:
            # A read of /stats, as an open dashboard makes every second: each limit's top keys then count the
            # admissions too, for 10 minutes (denials are counted always).
            urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/stats", timeout=30).read()
        scheme = "https" if "tls" in config.stem else "http"
        load(3, connections, clients, headers, request, work, scheme)
        subprocess.run(["callgrind_control", "--zero", str(gateway.pid)], check=True, capture_output=True)
        calls_before = script_calls()
        requests = load(seconds, connections, clients, headers, request, work, scheme)
        calls = script_calls() - calls_before
        if "tokens" in config.stem:
            check_usage_read(connections)
        subprocess.run(["callgrind_control", "--dump", str(gateway.pid)], check=True, capture_output=True)
        dumps = sorted(work.glob(f"callgrind.{config.stem}.{gateway.pid}.*"))
        if not dumps:
            sys.exit("gateway_cost: callgrind wrote no dump")
        total, copies = instructions(dumps[-1])
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(dumps[-1], keep / f"callgrind.{config.stem}")
        functions = heaviest(dumps[-1], requests, top) if top else []
        misses = instruction_cache_misses(dumps[-1]) / requests if cache else 0.0
        return total / requests, copies / requests, requests / calls if calls else 0.0, misses, functions
    finally:
        gateway.terminate()
        gateway.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="length of the measured wrk run")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--binary", type=Path, default=TOLLGATE, help="the tollgate to measure")
    parser.add_argument("--top", type=int, default=0, help="also list the cost by crate and this many heaviest functions per configuration")
    parser.add_argument("--cache", action="store_true", help="also count instruction-cache misses (callgrind's cache simulation)")
    parser.add_argument(
        "--only", choices=[case[1] for case in CASES] + list(GROUPS),
        help="measure this configuration alone (llm, concurrency: those groups of rows)",
    )
    parser.add_argument("--keep", type=Path, help="copy the callgrind dumps into this folder (for callgrind_annotate --inclusive=yes)")
    parser.add_argument("--jwt", action="store_true", help="print the bench/configs/*-jwt.yaml token and exit")
    parser.add_argument("--idle", type=int, default=0, metavar="N",
                        help="also measure the memory of one idle keep-alive connection (N open), tollgate and nginx")
    parser.add_argument("--look", action="store_true",
                        help="someone looks at the top keys through each run (a /stats read before it): admissions counted")
    args = parser.parse_args()
    if args.jwt:
        print(jwt())
        return
    for tool in ("valgrind", "callgrind_control", "nginx", "redis-server", "redis-cli", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"gateway_cost: {tool} not found (apt-get install valgrind nginx-light redis-server wrk)")
    if not args.binary.exists():
        sys.exit(f"gateway_cost: no {args.binary}: build first (cargo build --release)")

    with tempfile.TemporaryDirectory(prefix="gateway_cost.") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        certificate(work)
        for name, size in (("sse1k", 1024), ("sse64k", 65536)):
            folder = work / "sse/v1" / name / "chat"
            folder.mkdir(parents=True)
            (folder / "completions").write_text(chat_stream(size))
        (work / "nginx.conf").write_text(
            f"""{nginx_main(work)}
http {{
    access_log off;
    keepalive_requests 10000000;
    server {{
        listen 127.0.0.1:{UPSTREAM_PORT};
        location / {{ return 200 "ok"; }}
        location /v1/json/ {{ default_type application/json; return 200 '{json.dumps(chat_completion())}'; }}
        # nginx serves files to GET only: a POST's 405 is turned into the file.
        location /v1/sse1k/ {{ default_type text/event-stream; root {work}/sse; error_page 405 =200 $uri; }}
        location /v1/sse64k/ {{ default_type text/event-stream; root {work}/sse; error_page 405 =200 $uri; }}
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
                f"{args.binary}: instructions per request (callgrind; wrk, {args.connections} connections, "
                f"{args.seconds} s){', someone looking at the top keys' if args.look else ''}"
            )
            print()
            misses_head, misses_rule = (" I1 misses per request |", "--:|") if args.cache else ("", "")
            print(
                "| configuration | instructions per request | of which memcpy/memmove | without them |"
                f" requests per script call |{misses_head}"
            )
            print(f"|---|--:|--:|--:|--:|{misses_rule}")
            profiles = []
            costs: dict[str, float] = {}
            names = GROUPS.get(args.only, [args.only])
            cases = [case for case in CASES if case[1] in names or (args.only is None and case[4])]
            for label, case, name, clients, _, headers, request in cases:
                subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "flushall"], capture_output=True)
                cost, copies, per_call, misses, functions = measure(
                    args.binary, ROOT / "bench/configs" / f"{name}.yaml", args.seconds, args.connections, work, args.top,
                    args.cache, args.keep, clients, headers, request, case, args.look,
                )
                per_call_text = f"{per_call:.1f}" if per_call else "-"
                misses_text = f" {misses:,.0f} |" if args.cache else ""
                print(
                    f"| {label} | {cost:,.0f} | {copies:,.0f} | {cost - copies:,.0f} | {per_call_text} |{misses_text}",
                    flush=True,
                )
                profiles.append((label, functions))
                costs[case] = cost
            ratios = [(text, costs[ours] / costs[theirs]) for ours, theirs, text in RATIOS
                      if ours in costs and theirs in costs]
            if ratios:
                print()
                for text, ratio in ratios:
                    print(f"instructions per request, {text}: {ratio:.2f}x")
            if args.idle:
                print()
                for label, config in (("tollgate, limiting off", "off"), ("nginx proxy_pass", "nginx-pass")):
                    held = idle_memory(args.binary, ROOT / "bench/configs" / f"{config}.yaml", work, args.idle)
                    print(f"memory of an idle keep-alive connection, {label}: {held / 1024:.1f} KB ({args.idle} open)")
            for label, functions in profiles if args.top else []:
                print(f"\n{label}: instructions per request by crate (inlined code counts where it was inlined), then")
                print("in the function itself\n")
                for function, cost in functions:
                    print(f"{cost:9,.0f}  {function[:150]}")
        finally:
            upstream.terminate()
            redis.terminate()
            upstream.wait()
            redis.wait()


if __name__ == "__main__":
    main()
