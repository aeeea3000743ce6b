#!/usr/bin/env python3
"""Lists the largest stack frames in the tollgate binary, and the frames of the functions that run at every poll of
a proxied request.

A future's poll function reserves one stack frame for everything inlined into it, including the paths it rarely
takes (spawning a task, opening a connection, serving HTTP/2). Above a page the frame is probed page by page at
every call, and its hot locals end up spread over pages: session 20 found `route_request`'s poll reserving 38 KB
(inlined spawns of cold tasks) and the connection task's 23 KB (hyper-util's `auto` connection, HTTP/2 included),
and moving those paths out of line gained about 5% req/s each. This lists what is left.

    cargo build --release && python3 bench/stack_frames.py
    python3 bench/stack_frames.py --binary /tmp/tollgate-before --top 40

Reads `objdump -d` of the binary (binutils). The frame of a function is what its prologue subtracts from the stack
pointer, the page-probing loop included. Functions are named as demangled, so monomorphised copies share a name;
the largest copy is shown.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLLGATE = ROOT / "target/release/tollgate"
# Functions that run at every poll of a proxied request's tasks (the connection task, the request future, the
# upstream connection task), and what limit checks run through.
HOT = [
    "tollgate::server::connection::serve_connection::{{closure}}",
    "tollgate::server::connection::serve_connection::{{closure}}::{{closure}}::{{closure}}",
    # The same two in builds from before the connections moved to server/, to compare with (`--binary`).
    "tollgate::gateway::server::serve_connection::{{closure}}",
    "tollgate::gateway::server::serve_connection::{{closure}}::{{closure}}::{{closure}}",
    # The connection task before session 20 (hyper-util's `auto` connection).
    "tollgate::gateway::server::serve::{{closure}}::{{closure}}",
    "tollgate::gateway::handler::Gateway::route_request::{{closure}}",
    "tollgate::proxy::pool::open::{{closure}}::{{closure}}",
    "tollgate::limiter::store::batcher::coalesce::{{closure}}",
    "<hyper::proto::h1::role::Server as hyper::proto::h1::Http1Transaction>::parse",
    "hyper::proto::h1::dispatch::Dispatcher<D,Bs,I,T>::poll_write",
]
PROLOGUE_LINES = 30


def frames(binary: Path) -> dict[str, int]:
    """The stack frame of every function in `binary`, in bytes (the largest copy of each name)."""
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(binary)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    sizes: dict[str, int] = {}
    name, size, line, probing = None, 0, 0, False

    def finish() -> None:
        if name is not None:
            sizes[name] = max(size, sizes.get(name, 0))

    for text in disassembly.splitlines():
        start = re.match(r"^[0-9a-f]+ <(.*)>:$", text)
        if start:
            finish()
            name, size, line, probing = start.group(1), 0, 0, False
            continue
        if name is None:
            continue
        line += 1
        if line > PROLOGUE_LINES:
            continue
        sub = re.search(r"sub\s+\$0x([0-9a-f]+),%(rsp|r11)", text)
        if sub:
            value = int(sub.group(1), 16)
            if sub.group(2) == "r11":
                # The probing loop's bound: the loop then subtracts a page at a time up to it.
                size += value
            elif not (probing and value == 0x1000):
                size += value
        # A loop that probes a page at a time starts by copying the stack pointer to r11.
        probing = probing or bool(re.search(r"mov\s+%rsp,%r11", text))
    finish()
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=TOLLGATE, help="the tollgate to read")
    parser.add_argument("--top", type=int, default=20, help="how many of the largest frames to list")
    args = parser.parse_args()
    if not args.binary.exists():
        sys.exit(f"stack_frames: no {args.binary}: cargo build --release first")
    sizes = frames(args.binary)
    print(f"{args.binary}: the {args.top} largest stack frames\n")
    print("| bytes | function |\n|--:|---|")
    for name, size in sorted(sizes.items(), key=lambda item: -item[1])[: args.top]:
        print(f"| {size:,} | `{name[:140]}` |")
    print("\nThe request path's polls (-: no function of that name, inlined or not in this build):\n")
    print("| bytes | function |\n|--:|---|")
    for name in HOT:
        size = sizes.get(name)
        shown = "-" if size is None else f"{size:,}"
        print(f"| {shown} | `{name}` |")


if __name__ == "__main__":
    main()
