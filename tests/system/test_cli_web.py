"""``tether web`` and ``tether info`` through the real command line (``python -m tether``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tether import Tether
from tether.base._embedded import free_port

from ..apps import ops
from ..helpers import FAST, ROOT, WorkerProcess, wait_until
from ..web_helpers import TOKEN, valkey_url  # noqa: F401  (a fixture)

APP = "tests.apps.ops:app"


def cli_env(url: str, namespace: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TETHER_URL": url,
        "TETHER_NAMESPACE": namespace,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=env,
    )  # fmt: skip


class Served:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tether", "web", *args],
            env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, base: str) -> None:
        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"tether web exited:\n{self.log()}")
            try:
                httpx.get(base + "/api/health", timeout=1)
            except httpx.TransportError:
                return False
            return True

        wait_until(up, timeout=30, interval=0.05)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(20)
        self._log.close()
        return code


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    """One server for these tests (see ``valkey_url``)."""
    return valkey_url


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        if s.process.poll() is None:
            s.process.kill()
            s.process.wait(10)


def test_web_refuses_a_public_address_without_a_token(url: str, namespace: str) -> None:
    done = run_cli("web", APP, "--bind", "0.0.0.0:0", env=cli_env(url, namespace))
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in done.stderr
    short = run_cli(
        "web", APP, "--bind", "0.0.0.0:0", env=cli_env(url, namespace, TETHER_WEB_TOKEN="short")
    )
    assert short.returncode == 2 and "at least 16 characters" in short.stderr


def test_servers_listen_on_the_loopback_interface_unless_told_otherwise(
    url: str, namespace: str
) -> None:
    """``tether web``, ``tether exporter`` and the worker's metrics server default to a
    loopback address (read from each command's own help, as a user sees it)."""

    def default_of(command: str, option: str) -> str:
        text = " ".join(run_cli(command, "--help", env=cli_env(url, namespace)).stdout.split())
        found = re.search(rf"{option} \S+ .*?\[default: ([^\]]+)\]", text)
        assert found, text
        return found.group(1).replace(" ", "")

    for command, option in [("web", "--bind"), ("exporter", "--bind"),
                            ("worker", "--metrics-bind")]:  # fmt: skip
        host = default_of(command, option).rpartition(":")[0] or default_of(command, option)
        assert host == "127.0.0.1", (command, option, host)


def test_web_serves_the_api_with_the_token_and_stops_on_sigterm(
    url: str, namespace: str, tmp_path: Path, served: list[Served]
) -> None:
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = Served(
        [APP, "--bind", f"127.0.0.1:{port}", "--token-file", str(token_file), "--read-only"],
        cli_env(url, namespace),
        tmp_path / "web.log",
    )
    served.append(server)
    base = f"http://127.0.0.1:{port}"
    server.wait_serving(base)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(base + "/api/queues").status_code == 401
    health = httpx.get(base + "/api/health", headers=bearer)
    assert health.status_code == 200 and health.json()["namespace"] == namespace
    assert httpx.post(base + "/api/queues/default/pause", headers=bearer).status_code == 403
    # uvicorn shuts down gracefully, then ends by the signal it got (as a service manager expects).
    assert server.stop() in (0, -signal.SIGTERM)
    log = server.log()
    assert "Application shutdown complete" in log, log
    assert "(read-only)" in log and TOKEN not in log


def test_web_on_loopback_without_a_token_generates_one_and_logs_it(
    url: str, namespace: str, tmp_path: Path, served: list[Served]
) -> None:
    port = free_port()
    server = Served([APP, "--bind", f"127.0.0.1:{port}"], cli_env(url, namespace),
                    tmp_path / "web.log")  # fmt: skip
    served.append(server)
    base = f"http://127.0.0.1:{port}"
    server.wait_serving(base)
    match = re.search(r"this run's token is (\S+)", server.log())
    assert match, server.log()
    assert httpx.get(base + "/api/health").status_code == 401
    bearer = {"Authorization": f"Bearer {match.group(1)}"}
    assert httpx.get(base + "/api/health", headers=bearer).status_code == 200
    server.stop()


def test_info_prints_every_queue_and_the_fleet(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    producer = ops.fresh(url, namespace)
    producer.ok.options(priority="high").enqueue_many_sync([(i,) for i in range(2)])
    producer.ok.enqueue_many_sync([(i,) for i in range(3)])
    producer.ok.options(delay=600).enqueue_sync(1)
    producer.other.enqueue_sync(1)
    producer.app.close_sync()
    worker = WorkerProcess(url, namespace, "info-w", app=APP, queues="idle", log_dir=tmp_path,
                           **FAST)  # fmt: skip
    workers.append(worker)
    client = Tether(url, namespace=namespace).sync_client
    worker.wait_ready(client)
    env = cli_env(url, namespace)
    time.sleep(2 * FAST["heartbeat_interval"])  # the registry record follows the lease
    done = run_cli("info", "--app", APP, "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    queues = {q["name"]: q for q in report["queues"]}
    assert set(queues) == {"default", "idle", "ops-b"}
    default = queues["default"]
    assert default["waiting"] == {"high": 2, "normal": 3, "low": 0}
    assert (default["running"], default["delayed"], default["dead"]) == (0, 1, 0)
    assert default["oldest_waiting_s"] >= 0 and default["workers"] == 0
    assert queues["ops-b"]["depth"] == 1 and queues["idle"]["workers"] == 1
    assert report["workers"] == 1
    table = run_cli("info", "--app", APP, env=env)
    assert table.returncode == 0, table.stderr
    assert "default" in table.stdout and "ops-b" in table.stdout
    assert "live workers: 1" in table.stdout
    empty = run_cli("info", env=cli_env(url, namespace + "-empty"))
    assert empty.returncode == 0 and "no known queues" in empty.stdout
