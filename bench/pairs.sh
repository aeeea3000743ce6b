#!/usr/bin/env bash
# bench/pairs.sh: the throughput ratio of two tollgate configurations, measured in back-to-back pairs.
#
#   bench/pairs.sh                                         # off.yaml against redis-pass.yaml, 4 cycles
#   bench/pairs.sh bench/configs/off.yaml bench/configs/memory-pass.yaml 6
#   PAIRS_HEADER='x-api-key: bench-key' bench/pairs.sh bench/configs/redis-header.yaml bench/configs/redis-consumer.yaml
#   PAIRS_HEADER="authorization: Bearer $(python3 bench/gateway_cost.py --jwt)" \
#       bench/pairs.sh bench/configs/redis-pass.yaml bench/configs/redis-jwt.yaml   # A: the same limits by address
#   BENCH_TOLLGATE=/tmp/tollgate-before PAIRS_TOLLGATE_B=target/release/tollgate \
#       bench/pairs.sh bench/configs/redis-pass.yaml bench/configs/redis-pass.yaml   # two builds, one config
#
# This machine's speed drifts by up to a fifth within minutes, and bench/run.sh measures its targets minutes apart
# and keeps each one's best round, so its ratios move by 5-10 points between runs of one build. Here the two
# configurations run in A B B A order, cycle after cycle, each run a fresh tollgate with a short warm-up: a drift
# that is linear over a cycle cancels, and the spread of the cycles shows what is left. Prints every run, each
# cycle's ratio and the ratio of the sums, then where each configuration's CPU time per request went on the
# servers' core: tollgate, the upstream and Redis (every server shares CPU 0, so B's extra on any of them is
# throughput lost).
#
# Knobs (environment): PAIRS_HEADER (a request header every request carries, e.g. an API key), PAIRS_SECONDS (each run, 5), PAIRS_WARMUP (1), PAIRS_CONNECTIONS (64), BENCH_TOLLGATE (the
# binary, default target/release/tollgate), PAIRS_TOLLGATE_B (B's binary, default the same: set it to compare two
# builds), PAIRS_UPSTREAM_CPU and PAIRS_REDIS_CPU (0: the CPU the upstream and Redis run on; both 1 gives tollgate
# CPU 0 to itself, as a gateway has its own machine in production). Like bench/run.sh: by default the servers
# pinned on CPU 0, wrk on CPU 1, the same fixed loopback ports (16379 Redis, 18081 upstream, 18090 and 19901
# tollgate), so do not run both at once.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
A=${1:-$ROOT/bench/configs/off.yaml}
B=${2:-$ROOT/bench/configs/redis-pass.yaml}
CYCLES=${3:-4}
SECONDS_EACH=${PAIRS_SECONDS:-5}
WARMUP=${PAIRS_WARMUP:-1}
CONNECTIONS=${PAIRS_CONNECTIONS:-64}
TOLLGATE=${BENCH_TOLLGATE:-$ROOT/target/release/tollgate}
HEADER_ARGS=()
[[ -n ${PAIRS_HEADER:-} ]] && HEADER_ARGS=(-H "$PAIRS_HEADER")
TOLLGATE_B=${PAIRS_TOLLGATE_B:-$TOLLGATE}
UPSTREAM_CPU=${PAIRS_UPSTREAM_CPU:-0}
REDIS_CPU=${PAIRS_REDIS_CPU:-0}
export RUST_LOG=warn TOKIO_WORKER_THREADS=${TOKIO_WORKER_THREADS:-1}
export BENCH_REDIS_URL=redis://127.0.0.1:16379 BENCH_UPSTREAM_URL=http://127.0.0.1:18081
export BENCH_JWT_SECRET=${BENCH_JWT_SECRET:-bench-secret-of-at-least-32-bytes}   # bench/configs/*-jwt.yaml

for tool in nginx redis-server redis-cli wrk curl taskset; do
    command -v "$tool" >/dev/null || { echo "pairs: $tool not found (bench/run.sh installs what it needs)" >&2; exit 1; }
done
for binary in "$TOLLGATE" "$TOLLGATE_B"; do
    [[ -x $binary ]] || { echo "pairs: no $binary: cargo build --release first" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/tollgate-pairs.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_http() { # URL
    local i
    for i in $(seq 100); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 0.1
    done
    echo "pairs: $1 did not answer within 10 s" >&2
    exit 1
}

mkdir -p "$WORK/logs"
cat >"$WORK/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process off;
pid $WORK/nginx.pid;
error_log $WORK/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    server {
        listen 127.0.0.1:18081 backlog=4096;
        default_type text/plain;
        location / { return 200 "ok"; }
    }
}
CONF
taskset -c "$UPSTREAM_CPU" nginx -p "$WORK" -c "$WORK/nginx.conf" -e "$WORK/logs/error.log" &
PIDS+=("$!")
taskset -c "$REDIS_CPU" redis-server --bind 127.0.0.1 --port 16379 --save "" --appendonly no --dir "$WORK" \
    >"$WORK/redis.log" &
PIDS+=("$!")
wait_http http://127.0.0.1:18081/
until redis-cli -p 16379 ping >/dev/null 2>&1; do sleep 0.1; done

NGINX_PID=${PIDS[0]} REDIS_PID=${PIDS[1]}

# CPU time (ns) of every thread of PID so far: the scheduler's own account where the kernel exposes it (exact to
# the nanosecond), else utime + stime in clock ticks.
cpu_ns() { # PID
    if [[ -r /proc/$1/sched ]]; then
        cat /proc/"$1"/task/*/sched 2>/dev/null | awk '/se.sum_exec_runtime/ { ms += $3 } END { printf "%.0f", ms * 1e6 }'
    else
        cat /proc/"$1"/task/*/stat 2>/dev/null | sed 's/^.*) //' |
            awk -v hz="$(getconf CLK_TCK)" '{ t += $12 + $13 } END { printf "%.0f", t * 1e9 / hz }'
    fi
}

# Clock ticks CPU 0 has been idle so far.
idle_ticks() { awk '$1 == "cpu0" { print $5 }' /proc/stat; }

# Clock ticks PID has spent in user space so far (the kernel's sampled split, unlike cpu_ns's total).
user_ticks() { sed 's/^.*) //' /proc/"$1"/stat | awk '{ print $12 }'; }

run() { # CONFIG BINARY: prints "REQUESTS/S REQUESTS TOLLGATE_NS UPSTREAM_NS REDIS_NS IDLE_TICKS TOLLGATE_USER_TICKS"
    # for one fresh tollgate
    redis-cli -p 16379 flushall >/dev/null
    taskset -c 0 "$2" --config "$1" >"$WORK/tollgate.log" 2>&1 &
    local pid=$!
    wait_http http://127.0.0.1:19901/readyz
    taskset -c 1 wrk -t1 -c"$CONNECTIONS" -d"${WARMUP}s" "${HEADER_ARGS[@]}" http://127.0.0.1:18090/ >/dev/null
    local out before after
    before="$(cpu_ns "$pid") $(cpu_ns "$NGINX_PID") $(cpu_ns "$REDIS_PID") $(idle_ticks) $(user_ticks "$pid")"
    out=$(taskset -c 1 wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_EACH}s" "${HEADER_ARGS[@]}" http://127.0.0.1:18090/)
    after="$(cpu_ns "$pid") $(cpu_ns "$NGINX_PID") $(cpu_ns "$REDIS_PID") $(idle_ticks) $(user_ticks "$pid")"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    awk -v before="$before" -v after="$after" '
        / requests in / { requests = $1 }
        /Requests\/sec/ { rps = $2 }
        END {
            split(before, b, " "); split(after, a, " ")
            printf "%.0f %d %.0f %.0f %.0f %d %d", rps, requests, a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4],
                a[5] - b[5]
        }' <<<"$out"
}

# Per configuration: requests and CPU ns summed over its runs.
declare -A TOTAL=([a_requests]=0 [a_tollgate]=0 [a_upstream]=0 [a_redis]=0 [a_idle]=0 [a_user]=0 [b_requests]=0
    [b_tollgate]=0 [b_upstream]=0 [b_redis]=0 [b_idle]=0 [b_user]=0)
# Adds one run to a|b's sums and sets RPS to its requests per second (a variable, not output: a command
# substitution would run it in a subshell, and the sums would not last).
account() { # a|b "REQUESTS/S REQUESTS TOLLGATE_NS UPSTREAM_NS REDIS_NS IDLE_TICKS TOLLGATE_USER_TICKS"
    local fields
    read -ra fields <<<"$2"
    TOTAL[$1_requests]=$((TOTAL[$1_requests] + fields[1]))
    TOTAL[$1_tollgate]=$((TOTAL[$1_tollgate] + fields[2]))
    TOTAL[$1_upstream]=$((TOTAL[$1_upstream] + fields[3]))
    TOTAL[$1_redis]=$((TOTAL[$1_redis] + fields[4]))
    TOTAL[$1_idle]=$((TOTAL[$1_idle] + fields[5]))
    TOTAL[$1_user]=$((TOTAL[$1_user] + fields[6]))
    RPS=${fields[0]}
}

echo "A = $(basename "$A"), B = $(basename "$B"); $CYCLES cycles of A B B A, ${SECONDS_EACH} s runs," \
    "$CONNECTIONS connections; tollgate on CPU 0, upstream on CPU $UPSTREAM_CPU, Redis on CPU $REDIS_CPU, wrk on CPU 1"
sum_a=0 sum_b=0
for cycle in $(seq "$CYCLES"); do
    account a "$(run "$A" "$TOLLGATE")"; a1=$RPS
    account b "$(run "$B" "$TOLLGATE_B")"; b1=$RPS
    account b "$(run "$B" "$TOLLGATE_B")"; b2=$RPS
    account a "$(run "$A" "$TOLLGATE")"; a2=$RPS
    sum_a=$((sum_a + a1 + a2)) sum_b=$((sum_b + b1 + b2))
    awk -v c="$cycle" -v a1="$a1" -v b1="$b1" -v b2="$b2" -v a2="$a2" \
        'BEGIN { printf "cycle %d: A %d, B %d, B %d, A %d req/s: B/A = %.1f%%\n", c, a1, b1, b2, a2, 100 * (b1 + b2) / (a1 + a2) }'
done
awk -v a="$sum_a" -v b="$sum_b" 'BEGIN { printf "all cycles: B/A = %.1f%%\n", 100 * b / a }'
echo "CPU time per request, all cycles (us): A / B / B - A"
for side in a b; do
    TOTAL[${side}_together]=$((TOTAL[${side}_tollgate] + TOTAL[${side}_upstream] + TOTAL[${side}_redis]))
done
for part in tollgate upstream redis together; do
    awk -v part="$part" -v ra="${TOTAL[a_requests]}" -v rb="${TOTAL[b_requests]}" -v a="${TOTAL[a_$part]}" \
        -v b="${TOTAL[b_$part]}" 'BEGIN { printf "  %-9s %6.2f / %6.2f / %+6.2f\n", part, a / ra / 1000, b / rb / 1000, b / rb / 1000 - a / ra / 1000 }'
done
# Of tollgate's time, how much was user space (its own code; the rest is the kernel's, mostly the sockets').
awk -v hz="$(getconf CLK_TCK)" -v ra="${TOTAL[a_requests]}" -v rb="${TOTAL[b_requests]}" -v a="${TOTAL[a_user]}" \
    -v b="${TOTAL[b_user]}" 'BEGIN {
        ua = a * 1e6 / hz / ra; ub = b * 1e6 / hz / rb
        printf "  tollgate in user space (sampled) %6.2f / %6.2f / %+6.2f\n", ua, ub, ub - ua
    }'
# Time CPU 0 spent idle: with the servers sharing it, near 0; with tollgate alone on it, what its waits left unused.
awk -v hz="$(getconf CLK_TCK)" -v runs=$((2 * CYCLES)) -v s="$SECONDS_EACH" -v a="${TOTAL[a_idle]}" -v b="${TOTAL[b_idle]}" \
    'BEGIN { printf "CPU 0 idle: %.1f%% / %.1f%%\n", 100 * a / (hz * runs * s), 100 * b / (hz * runs * s) }'
