"""The command line: help everywhere, the version, the worker, and the demo end to end."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import redis
from click.testing import CliRunner

from tether import WorkerSettings, __version__
from tether.base._settings import help_of
from tether.cli import main
from tether.cli._worker import for_terminal

from ..helpers import ROOT, WorkerProcess, wait_until

COMMANDS = [
    [],
    ["worker"],
    ["demo"],
    ["dead"],
    ["dead", "list"],
    ["schedules"],
    ["scheduler"],
    ["task"],
    ["task", "result"],
    ["check"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "tether")
def test_help_on_every_command(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_worker_help_shows_each_settings_help_from_its_field() -> None:
    """``tether worker --help``: one option per WorkerSettings field, whose help is the
    field's ``metadata["help"]`` (the option's own wrapping aside)."""
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0, result.output
    shown = "".join(result.output.split())
    for field in dataclasses.fields(WorkerSettings):
        text = for_terminal(help_of(field))
        assert text, f"WorkerSettings.{field.name} has no help"
        assert "--" + field.name.replace("_", "-") in result.output, field.name
        assert "".join(text.split()) in shown, f"--{field.name}: {text!r} is not shown"
    assert "--connect-timeout" not in result.output


def _every_command(group: click.Group, path: list[str]) -> list[list[str]]:
    found = []
    for name, command in group.commands.items():
        found.append([*path, name])
        if isinstance(command, click.Group):
            found += _every_command(command, [*path, name])
    return found


@pytest.mark.parametrize("command", _every_command(main, []), ids=" ".join)
def test_help_is_written_for_a_terminal(command: list[str]) -> None:
    """click prints help as written: no reStructuredText markup (``concurrency`` read so in
    tether worker --help), and a choice's default shown as the choice list spells it (the list
    said [debug|info|warning|error] and the default INFO)."""
    shown = CliRunner().invoke(main, [*command, "--help"], terminal_width=100)
    assert shown.exit_code == 0, shown.output
    assert "``" not in shown.output
    for choices, default in re.findall(r"\[([\w|]+)\]\s+\[default: (\w+)\]", shown.output):
        assert default in choices.split("|"), (choices, default)
    if command == ["worker"]:
        assert "Defaults to --concurrency." in " ".join(shown.output.split())
        assert "[debug|info|warning|error]" in shown.output


def test_worker_names_the_new_name_of_a_renamed_setting() -> None:
    result = CliRunner().invoke(main, ["worker", "tests.apps.tasks:app", "--connect-timeout", "1"])
    assert result.exit_code == 2
    assert "--connect-timeout is called --give-up-after now" in result.output


def test_worker_refuses_bad_settings_at_start() -> None:
    result = CliRunner().invoke(
        main, ["worker", "tests.apps.tasks:app", "--concurrency", "4", "--max-pending", "2"]
    )
    assert result.exit_code == 2
    assert "max_pending=2 is below concurrency=4" in result.output


def test_worker_refuses_an_app_that_is_not_one() -> None:
    result = CliRunner().invoke(main, ["worker", "tests.apps.tasks:runs_key"])
    assert result.exit_code == 2
    assert "not a Tether app" in result.output


def test_worker_process_logs_its_limits_and_stops_on_sigterm(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    proc = WorkerProcess(
        url, namespace, "w-cli", log_dir=tmp_path, queues="default,other", concurrency=7
    )
    workers.append(proc)
    proc.wait_ready(rds)
    proc.signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    log = proc.log()
    # The start line names the namespace: a worker started under the wrong one serves
    # queues that look right and never sees its tasks.
    started = "serving queues default,other (priorities high>normal>low) of namespace"
    assert f"{started} '{namespace}'" in log
    assert "concurrency=7 max_pending=7" in log
    assert "worker w-cli stopped" in log
    assert rds.exists(proc.lease_key()) == 0


def test_a_task_run_by_tether_worker_enqueues_tasks_through_the_app(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """Under ``tether worker`` nothing opened the app, so a task that enqueued another failed
    with NotOpen ("the Tether app is not open")."""
    proc = WorkerProcess(url, namespace, "w-fan", log_dir=tmp_path)
    workers.append(proc)
    proc.wait_ready(rds)
    from tests.apps import tasks

    tasks.app.configure(url=url, namespace=namespace)
    try:
        handle = tasks.fan_out.enqueue_sync("fan", 3)
        assert handle.result_sync(timeout=30) == ["fan.0", "fan.1", "fan.2"]
    finally:
        tasks.app.close_sync()
    runs = sorted(line.split(b"|")[0] for line in rds.lrange(f"{namespace}:runs", 0, -1))
    assert runs == [b"fan.0", b"fan.1", b"fan.2"]


def run_demo(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`tether demo` in its own process: on an embedded server, or on ``url``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TETHER_URL", None)
    if url:
        env["TETHER_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "tether", "demo", *args],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_demo_end_to_end(url: str) -> None:
    t0 = time.monotonic()
    done = run_demo("--tasks", "300", "--workers", "2", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started an embedded server" in done.stdout
    assert "throughput" in done.stdout
    started = re.search(r"started an embedded server \(pid (\d+)\)", done.stdout)
    assert started, done.stdout
    # It used to say "(pid gone)".
    assert f"stopped the embedded server (pid {started.group(1)})" in done.stdout
    assert time.monotonic() - t0 < 60


def test_demo_with_a_given_url(url: str) -> None:
    done = run_demo("--tasks", "100", "--workers", "2", url=url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "embedded server" not in done.stdout
    assert "100" in done.stdout


def test_demo_stops_every_process_it_started(url: str) -> None:
    done = run_demo("--tasks", "50", "--workers", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    pids = [
        int(p)
        for line in done.stdout.splitlines()
        if "pids" in line
        for p in line.split("pids")[1].replace(",", " ").split()
    ]
    assert len(pids) == 2

    def all_gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            return False
        return True

    wait_until(all_gone, 5)
