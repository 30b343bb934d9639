"""The fleet bars of docs/performance.md: two replicas against one, and what the Redis backend adds.

    python bench/fleet.py                          # both figures (about a minute)
    python bench/fleet.py --seconds 2 --rounds 3   # a quick look

Setup, all on loopback: the fixed-reply nginx upstream of bench/proxy.py; a Redis (the machine's,
redis://127.0.0.1:6379/0 by default, under a key prefix of this run's own, deleted after; --redis
names another); and `omniroute serve` processes of this checkout:

- *sqlite*: one instance on the default backend (a state file in a temp directory);
- *redis*: one replica on the Redis backend;
- *fleet-1* and *fleet-2*: one replica, and two replicas, of a Redis fleet behind an nginx load
  balancer (round-robin, keep-alive to the replicas), so both sides pay the same balancer.

Figures, each the median of per-round ratios with the targets taking turns (see bench/proxy.py):

1. fleet-2 / fleet-1 throughput under the same wrk load (--connections, default 16). Bar: >= 1.8,
   which needs cores for two replicas *and* the load generator, the balancer, the upstream and
   Redis: on a 2-core machine the replicas share what wrk and nginx leave, and the report says how
   much CPU each side used per request, so the limit can be read off.
2. redis - sqlite p50 at 1 connection, directly (no balancer). Bar: <= 0.3 ms. The request path
   reads only the memory tier, so this is the cost of the backend's bookkeeping, not of Redis.

Needs nginx, wrk and a reachable Redis. Exits 0 when everything ran (met or not), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BAR_TWO_REPLICAS = 1.8
BAR_ADDED_P50_MS = 0.3
PORTS = {
    "upstream": 18180,
    "sqlite": 14110,
    "redis": 14111,
    "fleet1": 14112,
    "fleet2a": 14113,
    "fleet2b": 14114,
}
LB_PORTS = {"fleet-1": 14120, "fleet-2": 14121}


def _bench_proxy() -> ModuleType:
    """bench/proxy.py's helpers (wrk, measure, CPU time), loaded by path: its name is the package's."""
    spec = importlib.util.spec_from_file_location("bench_proxy", HERE / "proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_proxy"] = module
    spec.loader.exec_module(module)
    return module


def replica_config(port: int, upstream: int, backend: str, prefix: str) -> str:
    state = f'\n[state]\nbackend = "{backend}"\nkey_prefix = "{prefix}"\n' if backend != "sqlite" else ""
    return f"""[server]
host = "127.0.0.1"
port = {port}
{state}
[providers.bench]
class = "local"
base_url = "http://127.0.0.1:{upstream}/v1"

[[providers.bench.connections]]
id = "bench-1"
"""


def balancer_config(tmp: Path, listen: int, replicas: list[int]) -> Path:
    servers = " ".join(f"server 127.0.0.1:{p};" for p in replicas)
    text = f"""worker_processes 1;
daemon off;
pid {tmp}/lb-{listen}.pid;
error_log {tmp}/lb-{listen}.err warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/lb-body-{listen};
  proxy_temp_path {tmp}/lb-proxy-{listen};
  upstream omniroute {{ {servers} keepalive 64; }}
  server {{
    listen 127.0.0.1:{listen};
    location / {{
      proxy_pass http://omniroute;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;  # the proxy answers only Host names it knows (DNS-rebinding guard)
      proxy_buffering off;
    }}
  }}
}}
"""
    path = tmp / f"lb-{listen}.conf"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=3, help="wrk duration of one round (default 3)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per figure (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections for the throughput figure")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="the Redis to share state through")
    args = ap.parse_args(argv)
    bp = _bench_proxy()
    import shutil

    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            print(f"missing {tool}: apt-get install -y nginx wrk", file=sys.stderr)
            return 1
    import redis

    client = redis.Redis.from_url(args.redis, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        print(f"no Redis at {args.redis} ({exc}): start one (redis-server --daemonize yes)", file=sys.stderr)
        return 1

    prefix = f"omniroute-bench:{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="omr-fleet-bench-") as tmp_name:
        tmp = Path(tmp_name)
        procs = bp.Processes(tmp)
        try:
            bp.UPSTREAM_PORT = PORTS["upstream"]
            upstream_conf = tmp / "upstream.conf"
            text = (HERE / "nginx-upstream.conf").read_text()
            text = text.replace("127.0.0.1:18080", f"127.0.0.1:{PORTS['upstream']}")
            upstream_conf.write_text(text.replace("/tmp/omr-bench-nginx", str(tmp / "nginx")))
            procs.start("upstream", ["nginx", "-c", str(upstream_conf)])
            instances = {
                "sqlite": ("sqlite", f"{prefix}unused:"),
                "redis": (args.redis, f"{prefix}one:"),
                "fleet1": (args.redis, f"{prefix}f1:"),
                "fleet2a": (args.redis, f"{prefix}f2:"),
                "fleet2b": (args.redis, f"{prefix}f2:"),
            }
            for name, (backend, key_prefix) in instances.items():
                config = tmp / f"{name}.toml"
                config.write_text(replica_config(PORTS[name], PORTS["upstream"], backend, key_prefix))
                env = {"OMNIROUTE_STATE": str(tmp / f"{name}.db"), "OMNIROUTE_REPLICA_ID": name}
                env.pop("OMNIROUTE_MANAGEMENT_TOKEN", None)
                procs.start(
                    name, [*bp.omniroute_command(), "serve", "--config", str(config)], cwd=ROOT, env=env
                )
            balancers = {"fleet-1": [PORTS["fleet1"]], "fleet-2": [PORTS["fleet2a"], PORTS["fleet2b"]]}
            for name, replicas in balancers.items():
                procs.start(
                    f"lb-{name}", ["nginx", "-c", str(balancer_config(tmp, LB_PORTS[name], replicas))]
                )
            for name, port in [*PORTS.items(), *LB_PORTS.items()]:
                if not bp.wait_port(port):
                    print(f"{name} did not start:\n{procs.log_tail(name)}", file=sys.stderr)
                    return 1

            def session(*names: str) -> int:
                return procs.session(names[0])

            # fleet-2's CPU is its two replicas': measured per replica session and summed below.
            fleet_targets = {
                "fleet-1": (LB_PORTS["fleet-1"], "bench/bench-model", "sk-bench", procs.session("fleet1")),
                "fleet-2": (LB_PORTS["fleet-2"], "bench/bench-model", "sk-bench", procs.session("fleet2a")),
            }
            c = args.connections
            print(
                f"fleet benchmark: wrk -t1; per figure {args.rounds} x {args.seconds} s, targets interleaved; "
                f"{os.cpu_count()} CPUs"
            )
            runs = bp.measure(fleet_targets, c, args.seconds, args.rounds)
            for name, results in runs.items():
                s = bp.summary(results)
                print(
                    f"  {name:8} c={c:<3} {s['rps']:9.0f} req/s  p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms"
                    f"  errors {s['errors']:.0f}  non-2xx {s['non2xx']:.0f}"
                )
            ratio = statistics.median(
                b["rps"] / a["rps"] for a, b in zip(runs["fleet-1"], runs["fleet-2"], strict=True)
            )

            direct = {
                "sqlite": (PORTS["sqlite"], "bench/bench-model", "sk-bench", procs.session("sqlite")),
                "redis": (PORTS["redis"], "bench/bench-model", "sk-bench", procs.session("redis")),
            }
            one = bp.measure(direct, 1, args.seconds, args.rounds)
            for name, results in one.items():
                s = bp.summary(results)
                print(
                    f"  {name:8} c=1   {s['rps']:9.0f} req/s  p50 {s['p50_ms']:.3f} ms  p99 {s['p99_ms']:.3f} ms"
                    f"  cpu {s['cpu_us']:.0f} µs/req  non-2xx {s['non2xx']:.0f}"
                )
            added = statistics.median(
                r["p50_ms"] - s["p50_ms"] for s, r in zip(one["sqlite"], one["redis"], strict=True)
            )
            print()
            print(f"  two replicas / one replica, {c} connections: {ratio:.2f}  (bar >= {BAR_TWO_REPLICAS})")
            print(
                f"  Redis backend's added p50 over SQLite, 1 connection: {added * 1000:+.0f} µs  (bar <= {BAR_ADDED_P50_MS * 1000:.0f} µs)"
            )
            print(
                "  on this machine wrk, the balancer, the upstream nginx, Redis and the replicas share "
                f"{os.cpu_count()} CPUs: two replicas can only go as fast as the CPU the others leave them"
            )
            return 0
        finally:
            procs.stop_all()
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)


if __name__ == "__main__":
    sys.exit(main())
