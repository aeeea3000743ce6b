#!/usr/bin/env bash
# bench/pgo.sh: builds tollgate with profile-guided optimisation (PGO), trained on bench/run.sh's own targets, and
# prints the binary's path (target/pgo/release/tollgate). Logs go to stderr.
#
#   bench/pgo.sh                  # about 12 minutes on 2 cores: two release builds and 3 minutes of training
#   BENCH_PGO=1 bench/run.sh      # builds it, then measures it
#
# Why: a proxied request runs 33,000-44,000 instructions spread over hyper, tokio, http and tollgate, and misses
# the instruction cache about 2,000 times (bench/gateway_cost.py under callgrind's cache simulation). With a
# profile of real traffic, LLVM inlines where calls are hot and lays the hot paths out together: 22% fewer
# instructions and half the instruction-cache misses per request (BENCHMARKS.md, session 15).
#
# Steps: llvm-profdata from rustup's llvm-tools (installed when missing); a release build instrumented with
# -Cprofile-generate (target/pgo-generate); bench/run.sh run with that binary as the training, short and once on
# tokio's single-threaded runtime and once on two workers (its results are thrown away); llvm-profdata merge; a
# release build with -Cprofile-use (target/pgo). Needs what bench/run.sh needs (nginx, redis-server, wrk; it
# installs them) and the same free ports.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROFILES=$ROOT/target/pgo-profiles
INSTRUMENTED=$ROOT/target/pgo-generate
OPTIMISED=$ROOT/target/pgo

log() { printf 'pgo: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
if [[ ! -x $profdata ]]; then
    log "rustup component add llvm-tools (for llvm-profdata)"
    rustup component add llvm-tools >&2
fi
[[ -x $profdata ]] || die "no llvm-profdata at $profdata"

rm -rf "$PROFILES"
mkdir -p "$PROFILES"
log "instrumented build ($INSTRUMENTED)"
(cd "$ROOT" && RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$PROFILES" CARGO_TARGET_DIR=$INSTRUMENTED \
    cargo build --release --quiet >&2)
# The build scripts of dependencies were instrumented too and left their profiles: not the gateway's.
rm -f "$PROFILES"/*.profraw

for workers in 1 2; do
    log "training: bench/run.sh with the instrumented build, TOKIO_WORKER_THREADS=$workers"
    training=$PROFILES/training-$workers
    BENCH_TOLLGATE=$INSTRUMENTED/release/tollgate TOKIO_WORKER_THREADS=$workers BENCH_RESULTS=$training \
        BENCH_ROUNDS=1 BENCH_DURATION=3 BENCH_WARMUP=1 BENCH_LATENCY_DURATION=1 BENCH_PROFILE=0 \
        BENCH_RSS_CONNECTIONS=2000 "$ROOT/bench/run.sh" >"$training.log" 2>&1 ||
        die "the training run failed; its end ($training.log):$(printf '\n'; tail -20 "$training.log")"
done
# The profile is written when the gateway exits: a run stopped by SIGKILL leaves none.
compgen -G "$PROFILES/*.profraw" >/dev/null || die "the training left no profile in $PROFILES"
"$profdata" merge -o "$PROFILES/merged.profdata" "$PROFILES"/*.profraw

log "optimised build ($OPTIMISED)"
(cd "$ROOT" && RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$PROFILES/merged.profdata" CARGO_TARGET_DIR=$OPTIMISED \
    cargo build --release --quiet >&2)
echo "$OPTIMISED/release/tollgate"
