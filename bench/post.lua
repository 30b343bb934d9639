wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "sk-bench")
wrk.body = '{"model":"MODEL","messages":[{"role":"user","content":"ping"}],"max_tokens":1}'
-- BENCH_BODY_FILE: send that file instead (bench/proxy.py's coding-agent body); MODEL in it is replaced too.
local body_file = os.getenv("BENCH_BODY_FILE")
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
end
local model = os.getenv("BENCH_MODEL") or "bench-model"
wrk.body = string.gsub(wrk.body, "MODEL", model, 1)
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f errors=%d non2xx=%d\n",
    summary.requests, summary.requests / (summary.duration / 1e6), latency:percentile(50)/1000, latency:percentile(90)/1000,
    latency:percentile(99)/1000, latency.max/1000, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
