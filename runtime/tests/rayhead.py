"""A Ray head on 127.0.0.1 for the runtime's end-to-end test, started the way raypipe's Rust
test environment does it (src/devenv/ray.rs): `ray start --head --block` with every port
chosen on loopback, a worker port range outside the ephemeral range, its own short temp dir,
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (so 127.0.0.1 stays the node address) and the same
sitecustomize.py (src/devenv/ray/sitecustomize.py), which moves the gRPC servers Serve opens
on every interface to 127.0.0.1. Stopped by the process ids it started, never `ray stop`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
WORKER_PORT_COUNT = 100
REPO_ROOT = Path(__file__).resolve().parents[2]
SITECUSTOMIZE = REPO_ROOT / "src" / "devenv" / "ray" / "sitecustomize.py"
DROPPED_VARIABLES = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def loopback_env() -> dict:
    """Environment for Ray processes (and a driver) that keeps them on 127.0.0.1."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Explicit: with the mode unset, a `~/.ray/auth_token` left by any earlier local Ray
        # turns token authentication on for the head, and this driver has no token.
        "RAY_AUTH_MODE": "disabled",
    }


def serve_env() -> dict:
    """Serve settings for the head, given by hand in RAYPIPE_SERVE_ENV (a JSON object), e.g. to
    run the suite in Serve's throughput mode as a user who opts into it would
    (`{"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH":
    "2147483647"}`, the mode with raypipe's defaults). CI leaves it unset: raypipe's defaults
    (`serve::SERVE_ENV_DEFAULTS`) change nothing in Serve's default mode. Without the router
    setting, throughput mode's bounded queues let a burst wait past the bound (the overload
    test fails in most runs)."""
    return json.loads(os.environ.get("RAYPIPE_SERVE_ENV") or "{}")


_LIVE_HEADS = set()


def _stop_live_heads_and_exit(signum, _frame):
    """SIGTERM (e.g. from `cargo test`'s timeout): stop our heads before dying, so no Ray
    process outlives the test run."""
    for head in list(_LIVE_HEADS):
        try:
            head.stop()
        except Exception:
            pass
    os._exit(128 + signum)


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _ephemeral_range():
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
            return True
        except OSError:
            return False


def pick_ports() -> dict:
    low, high = _ephemeral_range()
    start_low, start_high = (
        (20000, low - WORKER_PORT_COUNT) if low - WORKER_PORT_COUNT > 20000 else (high + 1, 65535 - WORKER_PORT_COUNT)
    )
    blocks = max(1, (start_high - start_low) // WORKER_PORT_COUNT)
    seed = os.getpid() * 7919
    for attempt in range(64):
        first = start_low + ((seed + attempt * 31) % blocks) * WORKER_PORT_COUNT
        if all(_free(p) for p in range(first, first + WORKER_PORT_COUNT)):
            break
    else:
        raise RuntimeError("no free block of worker ports")
    held, ports = [], []
    try:
        while len(ports) < 10:
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            held.append(s)
            port = s.getsockname()[1]
            if not first <= port < first + WORKER_PORT_COUNT:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    names = (
        "gcs",
        "dashboard",
        "agent_http",
        "agent_grpc",
        "runtime_env_agent",
        "metrics",
        "client_server",
        "node_manager",
        "object_manager",
        "serve_http",
    )
    result = dict(zip(names, ports, strict=True))
    result["min_worker"], result["max_worker"] = first, first + WORKER_PORT_COUNT - 1
    return result


def _proc_stat(pid: int):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2]), "start": int(fields[19])}


def _all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


class RayHead:
    def __init__(self, python_path, num_cpus: int = 8):
        self.ray = Path(sys.executable).with_name("ray")
        if not self.ray.is_file():
            raise RuntimeError(f"no `ray` beside {sys.executable}; run the tests with the Ray venv's Python")
        root = Path(tempfile.gettempdir())
        root = root if len(str(root)) <= 40 else Path("/tmp")
        for stale in root.glob("rp-rt-*-*"):  # left by a test process that was killed
            owner = stale.name.split("-")[2]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"rp-rt-{os.getpid()}-", dir=root))
        self.python_path = python_path
        self.num_cpus = num_cpus
        site = self.dir / "python"
        site.mkdir()
        shutil.copy(SITECUSTOMIZE, site / "sitecustomize.py")
        self.attempt = 0
        self._launch()
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _stop_live_heads_and_exit)

    def _launch(self) -> None:
        """`ray start` on freshly picked ports, in a temp dir of this attempt's own."""
        self.attempt += 1
        self.ports = pick_ports()
        temp = self.dir / f"ray{self.attempt}"
        temp.mkdir()
        self.temp_dir = temp
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_VARIABLES}
        env.update(loopback_env())
        env["PATH"] = f"{self.ray.parent}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = ":".join([str(self.dir / "python"), *map(str, self.python_path)])
        env.update(serve_env())
        p = self.ports
        args = [
            str(self.ray),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={LOOPBACK}",
            f"--port={p['gcs']}",
            "--include-dashboard=true",
            f"--dashboard-host={LOOPBACK}",
            f"--dashboard-port={p['dashboard']}",
            f"--dashboard-agent-listen-port={p['agent_http']}",
            f"--dashboard-agent-grpc-port={p['agent_grpc']}",
            f"--runtime-env-agent-port={p['runtime_env_agent']}",
            f"--metrics-export-port={p['metrics']}",
            f"--ray-client-server-port={p['client_server']}",
            f"--node-manager-port={p['node_manager']}",
            f"--object-manager-port={p['object_manager']}",
            f"--min-worker-port={p['min_worker']}",
            f"--max-worker-port={p['max_worker']}",
            f"--temp-dir={temp}",
            "--object-store-memory=200000000",
            f"--num-cpus={self.num_cpus}",
            "--disable-usage-stats",
            "--log-style=record",
            "--log-color=false",
        ]
        self.log_path = self.dir / f"head{self.attempt}.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            args,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.root_pid = self.process.pid
        _LIVE_HEADS.add(self)

    @property
    def gcs_address(self) -> str:
        return f"{LOOPBACK}:{self.ports['gcs']}"

    @property
    def serve_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['serve_http']}"

    def wait_started(self, timeout: float = 120, attempts: int = 2) -> None:
        """Until `ray start` reports the head up (GCS, raylet, dashboard launched). On a loaded
        machine `ray start` itself sometimes gives up ("timed out during startup", the dashboard
        not up in time): that is the machine, not what the tests check, so the head is started
        once more on fresh ports before the failure counts."""
        while True:
            deadline = time.monotonic() + timeout
            failure = None
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    failure = RuntimeError(f"ray start exited with {self.process.returncode}:\n{self.log_tail()}")
                    break
                if "Ray runtime started" in self.log_text():
                    return
                time.sleep(0.25)
            if failure is None:
                failure = TimeoutError(f"the Ray head did not start in {timeout}s:\n{self.log_tail()}")
            if self.attempt >= attempts:
                raise failure
            print(f"the Ray head failed to start (attempt {self.attempt}), starting it again: {failure}")
            self._stop_processes()
            self._launch()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def serve_log_lines(self, pattern: str, limit: int = 60) -> str:
        """The last `limit` lines of the head's Serve logs (controller, proxy, replicas) that
        match `pattern`, each with its file name: what a failing test prints to say why."""
        import re

        wanted = re.compile(pattern)
        found = []
        for log in sorted((self.temp_dir / "session_latest" / "logs" / "serve").glob("*.log")):
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            found.extend(f"{log.name}: {line}" for line in text.splitlines() if wanted.search(line))
        return "\n".join(found[-limit:])

    def own_pids(self):
        """`ray start`, its descendants and the members of its process group."""
        stats = {pid: _proc_stat(pid) for pid in _all_pids()}
        stats = {pid: s for pid, s in stats.items() if s}
        own = {pid for pid, s in stats.items() if s["pgrp"] == self.root_pid} | {self.root_pid}
        frontier = list(own)
        children = {}
        for pid, s in stats.items():
            children.setdefault(s["ppid"], []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in own:
                    own.add(child)
                    frontier.append(child)
        return {pid: stats[pid]["start"] for pid in own if pid in stats and stats[pid]["state"] != "Z"}

    def listening_addresses(self, extra_pids=()):
        """(ip, port) of every TCP socket a process of this head (or of extra_pids, e.g. the
        driver) listens on."""
        inodes = set()
        for pid in [*self.own_pids(), *extra_pids]:
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            except OSError:
                continue
        found = []
        for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
            try:
                rows = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                    continue
                hex_ip, hex_port = cols[1].split(":")
                raw = bytes.fromhex(hex_ip)
                # /proc stores each 32-bit word in host (little-endian) order.
                ip = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(
                    (socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, ip), int(hex_port, 16))
                )
        return found

    def stop(self) -> None:
        _LIVE_HEADS.discard(self)
        self._stop_processes()
        if not os.environ.get("RAYPIPE_TESTENV_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_processes(self) -> None:
        leftovers = self.own_pids()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        for pid, start in self.own_pids().items():
            leftovers.setdefault(pid, start)
        for pid, start in leftovers.items():
            s = _proc_stat(pid)
            if s and s["start"] == start and s["state"] != "Z":
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.process.poll() is None:
            self.process.wait(5)
        self.log.close()
