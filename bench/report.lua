-- wrk script for bench/run.sh: at the end of a run, prints one machine-readable line with the numbers the table
-- needs (wrk's own summary rounds latencies and hides the request count behind units).
--
-- With BENCH_KEYS=N in the environment every request carries `x-client: <one of N values>`, drawn at random, so
-- that a limit keyed by that header sees N distinct clients instead of one.

local keys = tonumber(os.getenv("BENCH_KEYS") or "")
if keys then
  math.randomseed(os.time())
  request = function()
    return wrk.format(nil, nil, { ["x-client"] = "client-" .. math.random(keys) })
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d max_us=%d non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
