#!/usr/bin/env python3
"""Counts the instructions redis-server spends in tollgate's limiter script, per call and per request, under
valgrind's callgrind: a count, not a time, so it is the same from run to run on a noisy machine and shows what a
change to the limiter script (crates/limiter/src/scripts/check/) costs or saves.

    python3 bench/script_cost.py            # needs redis-server and valgrind (apt-get install redis-server valgrind)
    python3 bench/script_cost.py --script /tmp/variant.lua --case 50:run     # a variant of the script, one case
    python3 bench/script_cost.py --sections --case 50:run     # what each part of one call costs

Each case sends CALLS script calls of a batch of requests, each request checking the three limits of
bench/configs/redis-pass.yaml (sliding_window, token_bucket, gcra), encoded as the gateway encodes them (see
crates/limiter/src/store/script/). The count of a case minus the count of the same number of empty calls is the script's
work. The empty call's own count (the script's fixed part: TIME, defining its functions) is that of an empty call
minus a script that only returns, each less the count of loading the script without calling it: compiling the
script is done once, not at every call (before session 19 it was counted, 30,000 of the 77,000 reported). "single"
and "run" requests share one client's keys (one entry each, or one run entry for all), "distinct" ones each have
keys of their own. Loopback only: the
server listens on 127.0.0.1 on a free port.
"""

import argparse
import hashlib
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_PATH = ROOT / "crates/limiter/src/scripts/check"
CALLS = 100
# Per limit: algorithm id, four parameters, cost, shadow (the key index goes in front), as in redis-pass.yaml.
LIMITS = [
    [1, 1_000_000_000, 1000, 0, 0, 1, 0],  # sliding_window 10^9 per 1 s
    [3, 1_000_000_000, 1_000_000_000, 1000, 0, 1, 0],  # token_bucket 10^9/s, burst 10^9
    [5, 1_000_000, 1, 1, 0, 1, 0],  # gcra 10^6/s, burst 10^6: 1 tick per ms, interval 1 tick
]


def msgpack_uint(v: int) -> bytes:
    if v < 0x80:
        return bytes([v])
    if v < 0x100:
        return b"\xcc" + bytes([v])
    if v < 0x10000:
        return b"\xcd" + struct.pack(">H", v)
    if v < 0x100000000:
        return b"\xce" + struct.pack(">I", v)
    return b"\xcf" + struct.pack(">Q", v)


def msgpack_array(values: list[int]) -> bytes:
    n = len(values)
    header = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n) if n < 0x10000 else b"\xdd" + struct.pack(">I", n)
    return header + b"".join(msgpack_uint(v) for v in values)


def batch(requests: int, shape: str) -> tuple[list[str], bytes]:
    """KEYS and the packed requests for `requests` requests of the three limits. `shape`: "run" (one client's
    identical requests, sent as one run entry, as the gateway sends them), "single" (the same requests one entry
    each: what the gateway sent before runs, and still sends for runs it cannot join), "distinct" (every request
    a client of its own)."""
    keys: list[str] = []
    packed: list[int] = []
    entries = 1 if shape == "run" and requests else requests
    for r in range(entries):
        client = f"c{r}" if shape == "distinct" else "c"
        # mode (commit), count, limits, deadline (none)
        packed += [1, requests if shape == "run" else 1, len(LIMITS), 0]
        for i, limit in enumerate(LIMITS):
            key = f"bench:api:l{i}:{{{client}}}"
            if key not in keys:
                keys.append(key)
            packed += [keys.index(key) + 1] + limit
    return keys, msgpack_array(packed)


class Redis:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args) -> bytes:
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        line = self.file.readline()
        if line[:1] == b"-":
            sys.exit(f"redis: {line.decode().strip()}")
        if line[:1] == b"$":
            n = int(line[1:])
            return self.file.read(n + 2)[:-2] if n >= 0 else b""
        if line[:1] == b"*":
            for _ in range(int(line[1:])):
                self.file.readline()
        return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instructions(script: str, requests: int, shape: str, calls: int = CALLS) -> int:
    """Instructions redis-server executed from start to shutdown for `calls` calls of `script` with `requests`
    requests. The count includes compiling the script (SCRIPT LOAD), once: a count of the same script with no calls
    takes it out."""
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server", "--port", str(port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work,
             "--hz", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                redis = Redis(port)
                redis.call("PING")
                break
            except OSError:
                if time.time() > deadline:
                    server.kill()
                    sys.exit("redis-server under valgrind did not start")
                time.sleep(0.2)
        sha = hashlib.sha1(script.encode()).hexdigest()
        redis.call("SCRIPT", "LOAD", script)
        keys, packed = batch(requests, shape)
        for _ in range(calls):
            redis.call("EVALSHA", sha, len(keys), *keys, "", packed)
        redis.call("SHUTDOWN", "NOSAVE")
        server.wait(timeout=120)
        totals = subprocess.run(["callgrind_annotate", out], capture_output=True, text=True).stdout
        line = next(l for l in totals.splitlines() if "PROGRAM TOTALS" in l)
        return int(line.split()[0].replace(",", ""))


# Where --sections cuts the script (a `do return 1 end` before the first line matching each pattern), and what the
# part ending there does. The script's sections run in this order for every call.
SECTIONS = [
    (r"^local cache = \{", "TIME and the MGET of every key"),
    (r"^local input = cmsgpack\.unpack", "defining the functions (Redis runs the whole script at every call)"),
    (r"^local a = 1$", "unpacking the argument (cmsgpack)"),
    (r"^-- The reply is written", "checking the argument"),
    (r"^a = 1$", "the reply's tables"),
    (r"^for k = 1, #KEYS do", "deciding the requests"),
    (r"^return cmsgpack\.pack", "writing the changed keys back (SET ... PX)"),
]


def sections(script: str, requests: int, shape: str) -> None:
    """Prints what each part of a call costs: the whole call (less compiling the script) with the script cut after
    each section in turn, and the difference from the cut before. A bare `return 1` is the call's own cost in
    Redis (the EVALSHA command, its arguments and reply)."""
    lines = script.split("\n")

    def per_call(text: str) -> float:
        return (instructions(text, requests, shape) - instructions(text, requests, shape, calls=0)) / CALLS

    print(f"{requests} request(s), {shape}: instructions per call, the script cut after each part in turn")
    print(f"{'part':<70} {'so far':>10} {'this part':>10}")
    before = per_call("return 1")
    print(f"{'a bare return: the EVALSHA call itself':<70} {before:>10,.0f} {before:>10,.0f}")
    for pattern, what in SECTIONS:
        at = next((i for i, line in enumerate(lines) if re.match(pattern, line)), None)
        if at is None:
            sys.exit(f"script_cost: no line matches {pattern!r}: update SECTIONS")
        so_far = per_call("\n".join(lines[:at] + ["do return 1 end"] + lines[at:]))
        print(f"{what:<70} {so_far:>10,.0f} {so_far - before:>10,.0f}")
        before = so_far
    whole = per_call(script)
    print(f"{'packing the reply (cmsgpack), the whole call':<70} {whole:>10,.0f} {whole - before:>10,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=SCRIPT_PATH,
                        help="the script to count, a file or a folder of parts joined in name order (default: tollgate's)")
    parser.add_argument("--case", action="append", metavar="REQUESTS:SHAPE",
                        help="only these cases, e.g. 50:run (shapes: single, run, distinct); repeatable")
    parser.add_argument("--sections", action="store_true",
                        help="what each part of a call costs, for the first --case (default 50:run)")
    args = parser.parse_args()
    # tollgate's script is a folder of parts, joined in name order into the one script Redis runs.
    parts = sorted(args.script.glob("*.lua")) if args.script.is_dir() else [args.script]
    script = "".join(part.read_text() for part in parts)
    for tool in ("valgrind", "callgrind_annotate", "redis-server"):
        if not shutil.which(tool):
            sys.exit(f"script_cost: {tool} not found (apt-get install valgrind redis-server)")
    if args.sections:
        requests, _, shape = (args.case or ["50:run"])[0].partition(":")
        sections(script, int(requests), shape)
        return
    # Compiling the script once (about 3 million instructions for tollgate's, 30,000 a call over 100 calls) is no
    # part of a call's cost: the empty call's count is taken less that of loading the script without calling it.
    bare = instructions("return 1", 0, "single") - instructions("return 1", 0, "single", calls=0)
    empty = instructions(script, 0, "single")
    empty_call = empty - instructions(script, 0, "single", calls=0)
    print(f"{CALLS} calls per case; instructions inside redis-server, less those of {CALLS} empty calls")
    print(f"{'case':<36} {'per call':>12} {'per request':>12}")
    print(f"{'empty call (less a bare return)':<36} {(empty_call - bare) / CALLS:>12,.0f}")
    cases = [(1, "single"), (10, "single"), (50, "single"), (10, "run"), (50, "run"), (10, "distinct"),
             (50, "distinct")]
    if args.case:
        cases = [(int(n), shape) for n, _, shape in (c.partition(":") for c in args.case)]
    for requests, shape in cases:
        work = instructions(script, requests, shape) - empty
        name = f"{requests} request(s), {shape}"
        print(f"{name:<36} {work / CALLS:>12,.0f} {work / CALLS / requests:>12,.0f}")

if __name__ == "__main__":
    main()
