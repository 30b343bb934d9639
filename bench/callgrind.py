"""Instructions per request, counted by valgrind's callgrind: the one proxy figure that does not
move with the machine's load (wall-clock ratios on a shared 2-core machine move by a tenth from
run to run; the same requests through the same code cost the same instructions).

    python bench/callgrind.py                          # omniroute, unrecorded and floor, small body
    python bench/callgrind.py --only omniroute --body agent --requests 100
    python bench/callgrind.py --connections 8         # eight requests in flight at a time, as wrk -c8
    python bench/callgrind.py --profile                # also keep the callgrind files to read with
                                                       #   callgrind_annotate (their paths are printed)

Each target runs under `valgrind --tool=callgrind` behind the bench's nginx upstream; one client
sends `--warmup` requests on one keep-alive connection (or `--connections` of them, sending at
once), the counters are zeroed
(`callgrind_control -z`), `--requests` more are sent, and the counters are dumped
(`callgrind_control -d`): instructions of the proxy process / requests. Targets: *omniroute*
(as `omniroute serve` runs), *unrecorded* (the same with `[server] request_history = 0`: no
request trail, no statistics) and *floor* (Starlette on uvicorn with no logic,
bench/floor_proxy.py). Needs nginx and valgrind (`apt-get install -y nginx valgrind`).
"""

from __future__ import annotations

import argparse
import http.client
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import proxy as bench  # noqa: E402  (bench/proxy.py: ports, configs, processes, the agent body)

TARGETS = ("omniroute", "unrecorded", "floor")


def target_command(name: str, tmp: Path) -> tuple[list[str], int, str, Path | None]:
    """(command, port, model, cwd) of a target, its config written into `tmp`."""
    if name == "floor":
        cmd = [sys.executable, "-m", "uvicorn", "floor_proxy:app", "--host", "127.0.0.1"]
        cmd += ["--port", str(bench.FLOOR_PORT), "--no-access-log", "--log-level", "warning"]
        return cmd, bench.FLOOR_PORT, "bench-model", HERE
    config = bench.omni_config()
    port = bench.OMNI_PORT
    if name == "unrecorded":
        port = bench.QUIET_PORT
        config = config.replace(f"port = {bench.OMNI_PORT}\n", f"port = {port}\nrequest_history = 0\n")
    path = tmp / f"{name}.toml"
    path.write_text(config)
    path.chmod(0o600)
    cmd = [*bench.omniroute_command(), "serve", "--config", str(path), "--state", str(tmp / f"{name}.db")]
    return cmd, port, "bench/bench-model", ROOT


def send(port: int, body: bytes, count: int) -> None:
    """`count` requests, one after another, on one keep-alive connection; each must succeed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    try:
        for _ in range(count):
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"request answered {response.status}")
    finally:
        conn.close()


def send_concurrently(port: int, body: bytes, count: int, connections: int) -> None:
    """`count` requests spread over `connections` keep-alive connections sending at once: the
    proxy then has several requests in flight, as under wrk."""
    if connections <= 1:
        send(port, body, count)
        return
    share, extra = divmod(count, connections)
    with ThreadPoolExecutor(connections) as pool:
        for done in [pool.submit(send, port, body, share + (i < extra)) for i in range(connections)]:
            done.result()


def measure(
    name: str, body_kind: str, requests: int, warmup: int, tmp: Path, keep: bool, connections: int = 1
) -> float:
    """Instructions per request of one target."""
    cmd, port, model, cwd = target_command(name, tmp)
    out = tmp / f"callgrind.{name}.{body_kind}"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
    procs = bench.Processes(tmp)
    try:
        procs.start(name, [*valgrind, *cmd], cwd=cwd, env={"FLOOR_UPSTREAM": upstream_url()})
        if not bench.wait_port(port, timeout=600):
            raise RuntimeError(f"{name} did not start:\n{procs.log_tail(name)}")
        pid = procs.session(name)
        body = request_body(body_kind, model, tmp)
        send_concurrently(port, body, warmup, connections)
        control(pid, "-z")
        send_concurrently(port, body, requests, connections)
        control(pid, "-d")
        total = dumped_instructions(out, pid)
    finally:
        procs.stop_all()
    if keep:
        print(f"  {name}: callgrind files {out}.{pid}*", file=sys.stderr)
    return total / requests


def upstream_url() -> str:
    return f"http://127.0.0.1:{bench.UPSTREAM_PORT}"


def request_body(kind: str, model: str, tmp: Path) -> bytes:
    if kind == "agent":
        return bench.agent_body(tmp / "agent.json").read_bytes().replace(b'"MODEL"', f'"{model}"'.encode())
    return b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":"ping"}],"max_tokens":1}'


def control(pid: int, flag: str) -> None:
    """callgrind_control acts when the program next runs; wait until it says it did."""
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True, timeout=120)


def dumped_instructions(out: Path, pid: int) -> int:
    """The instruction total of the newest dump (`-d` writes `<file>.<pid>.<n>`)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dumps = sorted(out.parent.glob(f"{out.name}.{pid}.*"), key=lambda p: int(p.suffix[1:]))
        if dumps:
            match = re.search(r"^(?:summary|totals): (\d+)", dumps[-1].read_text(), re.MULTILINE)
            if match:
                return int(match.group(1))
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(TARGETS), help=f"targets among {','.join(TARGETS)}")
    ap.add_argument("--body", choices=("small", "agent"), default="small")
    ap.add_argument("--requests", type=int, default=500, help="requests counted (default 500)")
    ap.add_argument("--warmup", type=int, default=200, help="requests before counting (default 200)")
    ap.add_argument(
        "--connections", type=int, default=1, help="keep-alive connections sending at once (default 1)"
    )
    ap.add_argument("--port-offset", type=int, default=0, help="add this to every port used")
    ap.add_argument("--profile", action="store_true", help="keep the callgrind files and print their paths")
    args = ap.parse_args(argv)
    wanted = [t.strip() for t in args.only.split(",") if t.strip()]
    if unknown := sorted(set(wanted) - set(TARGETS)):
        ap.error(f"unknown targets {unknown}; choose among {','.join(TARGETS)}")
    for tool in ("nginx", "valgrind", "callgrind_control"):
        if not shutil.which(tool):
            print(f"missing {tool}: apt-get install -y nginx valgrind", file=sys.stderr)
            return 1
    bench.offset_ports(args.port_offset)
    tmp = Path(tempfile.mkdtemp(prefix="omr-callgrind-"))
    upstream = bench.Processes(tmp)
    try:
        upstream.start("nginx", ["nginx", "-c", str(bench.moved(HERE / "nginx-upstream.conf", tmp))])
        if not bench.wait_port(bench.UPSTREAM_PORT):
            print(f"nginx did not start:\n{upstream.log_tail('nginx')}", file=sys.stderr)
            return 1
        results = {}
        for name in wanted:
            results[name] = measure(
                name, args.body, args.requests, args.warmup, tmp, args.profile, args.connections
            )
            print(f"{name:<11} {results[name] / 1e3:9.1f} k instructions per request", flush=True)
        if "omniroute" in results and "unrecorded" in results:
            ratio = results["unrecorded"] / results["omniroute"]
            print(f"recording: unrecorded / omniroute instructions {ratio:.3f}")
        if "omniroute" in results and "floor" in results:
            print(f"floor / omniroute instructions {results['floor'] / results['omniroute']:.3f}")
    finally:
        upstream.stop_all()
        if not args.profile:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
