"""CLI startup cost (issue 5): `omniroute breakers --json` against a running instance <= 3x `import httpx`.

    python bench/cli.py              # 21 runs of each, interleaved
    python bench/cli.py --runs 51

Starts `omniroute serve` (this checkout) on an ephemeral loopback port with a temporary config and
state, then times whole processes, wall clock from spawn to exit: the CLI command, which finds
the instance through OMNIROUTE_CONFIG as an operator's would (config read, HTTP call, JSON out),
and the baseline `python -c "import httpx"` (the interpreter plus the one library the CLI cannot
do without). Runs alternate so that load on the machine hits both alike; the bar is on medians.

Prints every figure. Exits 0 when the bar is met, 1 when it is not, 2 when something could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BAR = 3.0

CONFIG = """[server]
host = "127.0.0.1"
port = {port}

[providers.local]
class = "local"
base_url = "http://127.0.0.1:9/v1"

[[providers.local.connections]]
id = "local-1"

[providers.cloud]
class = "apikey"
base_url = "http://127.0.0.1:9/v1"

[[providers.cloud.connections]]
id = "cloud-1"
api_key = "sk-bench-0000000000000000"
"""


def omniroute_command() -> list[str]:
    """The installed console script next to this Python, else the same entry point through -c."""
    script = shutil.which("omniroute", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-c", "from omniroute_tui.cli import main; main()"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_serving(port: int, server: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"omniroute serve exited with {server.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"omniroute serve did not listen on {port} within {timeout_s:g} s")


def timed(command: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode().strip()}"
        )
    return elapsed, result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=21, help="runs of each command (default 21)")
    args = parser.parse_args()

    omniroute = omniroute_command()
    with tempfile.TemporaryDirectory(prefix="omniroute-bench-cli-") as tmp:
        port = free_port()
        config = Path(tmp) / "config.toml"
        config.write_text(CONFIG.format(port=port))
        config.chmod(0o600)
        env = {**os.environ, "OMNIROUTE_CONFIG": str(config), "OMNIROUTE_STATE": str(Path(tmp) / "state.db")}
        for name in ("OMNIROUTE_URL", "OMNIROUTE_MANAGEMENT_TOKEN"):
            env.pop(name, None)
        server = subprocess.Popen(
            [*omniroute, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_until_serving(port, server)
            cli = [*omniroute, "breakers", "--json"]
            baseline = [sys.executable, "-c", "import httpx"]
            _, out = timed(cli, env)  # warm the OS caches for both, and check the output is the data
            providers = [b["provider"] for b in json.loads(out)]
            if providers != ["local", "cloud"]:
                raise RuntimeError(f"unexpected output: {out[:200]!r}")
            timed(baseline, env)
            cli_times: list[float] = []
            base_times: list[float] = []
            for _ in range(args.runs):
                cli_times.append(timed(cli, env)[0])
                base_times.append(timed(baseline, env)[0])
        except RuntimeError as exc:
            print(f"bench/cli.py: {exc}", file=sys.stderr)
            return 2
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    cli_median = statistics.median(cli_times)
    base_median = statistics.median(base_times)
    ratio = cli_median / base_median
    print(f"runs each: {args.runs} (interleaved), instance: omniroute serve on 127.0.0.1:{port}")
    print(f"{'command':<40} {'median':>9} {'min':>9} {'max':>9}")
    for label, times in (("omniroute breakers --json", cli_times), ('python -c "import httpx"', base_times)):
        print(
            f"{label:<40} {statistics.median(times) * 1000:>7.1f}ms {min(times) * 1000:>7.1f}ms {max(times) * 1000:>7.1f}ms"
        )
    verdict = "meets" if ratio <= BAR else "MISSES"
    print(f"ratio of medians: {ratio:.2f}x ({verdict} the bar of <= {BAR:g}x)")
    return 0 if ratio <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
