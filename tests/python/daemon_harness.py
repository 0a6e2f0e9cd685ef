"""Starts and stops a live `winnow serve` on loopback for the daemon tests.

The binary and model come from $WINNOW_BIN and $WINNOW_MODEL (set by `make py-test`), falling
back to build/winnow and the default model; tests skip when either is missing.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python"))
import winnow_stubs  # noqa: E402

# The client package (clients/python/src) and its stubs, generated from this checkout's protos.
winnow_stubs.use_source_tree()

from winnow_client import WinnowClient, pb2  # noqa: E402,F401


# How many times slower the daemon under test runs than a release build: `make test-tsan` sets
# it for its ThreadSanitizer daemon. Tests scale the time they give the daemon's own work (a
# drain timeout that must let every accepted request finish) by it.
TIME_SCALE = float(os.environ.get("WINNOW_TEST_TIME_SCALE", "1"))


def binary_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get("WINNOW_BIN", REPO / "build" / "winnow"))


def model_path() -> pathlib.Path:
    return pathlib.Path(
        os.environ.get("WINNOW_MODEL", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def build_health_probe(directory: pathlib.Path) -> pathlib.Path:
    """deploy/docker/health_probe.cc built as the Dockerfile builds it, into `directory`."""
    import pytest

    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    out = directory / "winnow-health-probe"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True,
                           text=True, check=True).stdout.split()
    source = REPO / "deploy" / "docker" / "health_probe.cc"
    subprocess.run(["g++", "-O1", "-std=c++17", str(source), "-o", str(out), *flags], check=True,
                   timeout=300)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """One daemon process on free loopback ports. Use as a context manager or call stop()."""

    def __init__(self, *extra_args: str, threads: int = 2, env: dict | None = None,
                 wait: bool = True):
        self.port = free_port()
        # /metrics is served on the HTTP port (no separate --metrics-port by default).
        self.http_port = free_port()
        self.metrics_port = self.http_port
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.log = tempfile.NamedTemporaryFile(prefix="winnow-daemon-", suffix=".log",
                                               delete=False)
        args = [
            str(binary_path()), "serve",
            "--model", str(model_path()),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--threads", str(threads),
            *extra_args,
        ]
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("WINNOW_")}
        run_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=run_env)
        self.target = f"127.0.0.1:{self.port}"
        # Short reconnect backoff: the first connect races the daemon's start-up.
        channel = grpc.insecure_channel(self.target, options=[
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 200),
        ])
        self.client = WinnowClient(self.target, channel=channel)
        if wait:
            self.wait_serving()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def logs(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.client.health(timeout=1.0) == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not SERVING after {timeout}s:\n{self.logs()}")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, labels: dict | None = None) -> float:
        """Value of one sample (e.g. winnow_preemptions_total) from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.metrics_text()):
            for s in family.samples:
                if s.name == name and (labels is None or all(
                        s.labels.get(k) == v for k, v in labels.items())):
                    return s.value
        raise KeyError(name)

    def wait_pool_free(self, timeout: float = 10.0) -> None:
        """Waits until no request runs or waits and every KV block is free."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.client.server_status()
            if st.running == 0 and st.waiting == 0 and st.kv_blocks_free == st.kv_blocks_total:
                return
            time.sleep(0.05)
        raise AssertionError(f"pool not free after {timeout}s: {st}")

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
