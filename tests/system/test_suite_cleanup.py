"""A test run stopped by SIGINT, SIGTERM or SIGKILL leaves no server or worker behind.

Each case starts a run of its own (pytest in a subprocess, on a small test that starts a
server and a worker process and then waits), stops it with the signal once both are up, and
looks for what the run started: processes carrying its mark, and processes whose working
folder is in its temporary folders (a server rewrites its process title over its environment,
so it is found by its data folder)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import ROOT, wait_until
from ..reaper import MARK, alive, processes

INNER_TEST = """
import time

from tests.conftest import start_server
from tests.helpers import WorkerProcess


def test_waits_with_a_server_and_a_worker(tmp_path):
    server = start_server("valkey")
    worker = WorkerProcess(server.url, "cleanup", "w", log_dir=tmp_path)
    (tmp_path.parent.parent / "up").write_text(f"{server.pid} {worker.pid}")
    time.sleep(120)
"""


def _started_by(run_pid: int) -> list[int]:
    """Processes of the run owned by ``run_pid``: by mark, or by folder."""
    return [
        p.pid
        for p in processes()
        if (p.mark or "").startswith(f"{run_pid}:") or f"/tether-tests-{run_pid}-" in (p.cwd or "")
    ]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the watchdog finds processes in /proc")
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda sig: sig.name
)
def test_a_stopped_run_leaves_no_server_or_worker(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    basetemp = tmp_path / "basetemp"
    # Not inside this run's watch: the inner run is a run of its own, with its own watchdog.
    env = {k: v for k, v in os.environ.items() if k not in (MARK, "PYTEST_TETHER_COMPAT_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    command = [
        sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
        "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--basetemp", str(basetemp), "-p", "tests.conftest",  # the suite's, with its watchdog
        str(tmp_path / "test_inner.py"),
    ]  # fmt: skip
    inner = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        up = tmp_path / "up"
        wait_until(lambda: up.exists() and up.read_text(), timeout=60)
        server_pid, worker_pid = (int(pid) for pid in up.read_text().split())
        assert alive(server_pid) and alive(worker_pid)
        assert set(_started_by(inner.pid)) >= {worker_pid}
        inner.send_signal(sig)
        inner.wait(30)
        wait_until(lambda: not alive(server_pid) and not alive(worker_pid), timeout=15)
        wait_until(lambda: not [p for p in _started_by(inner.pid) if alive(p)], timeout=15)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait(10)
        if inner.stdout is not None:
            inner.stdout.close()
