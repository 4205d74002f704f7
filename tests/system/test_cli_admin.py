"""The command line as an operator uses it: flags that win over code, options generated from
the settings, modules that import alone, schedules that say what is wrong with them, dead
letters shown without burying the reason, cancel that says what happened."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import sys

import pytest
import redis
from click.testing import CliRunner

from tether import Tether
from tether.base._settings import WorkerSettings, default_of, help_of
from tether.cli import main
from tether.cli._dead import SHOWN_PAYLOAD
from tether.cli._worker import for_terminal
from tether.dead import DeadLetter
from tether.protocol._keys import SchedulerKeys
from tether.scheduler import Scheduler

from ..helpers import ROOT

CLI_MODULES = [
    "_bind", "_check", "_common", "_dead", "_demo", "_info", "_schedules", "_task", "_web",
    "_worker",
]  # fmt: skip


@pytest.mark.parametrize("module", CLI_MODULES)
def test_each_command_module_imports_on_its_own(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import tether.cli.{module}"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_worker_options_are_the_settings_fields_with_their_defaults() -> None:
    from tether.cli._worker import worker

    params = {p.name: p for p in worker.params}
    for field in dataclasses.fields(WorkerSettings):
        assert field.name in params, f"no option for WorkerSettings.{field.name}"
        default = params[field.name].default
        expected = default_of(field)
        expected = ",".join(expected) if isinstance(expected, tuple) else expected
        assert default == expected, field.name
        assert params[field.name].help == for_terminal(help_of(field)) != "", field.name


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=90,
    )  # fmt: skip


def test_an_explicit_url_wins_over_the_url_in_the_apps_code(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    from tests.apps import fixed_url

    # Enqueue on the real server, in the test's namespace (this process only).
    fixed_url.app.configure(url=url, namespace=namespace)
    try:
        task = fixed_url.add.enqueue_sync(2, 3)
    finally:
        fixed_url.app.close_sync()
    worker = run_cli(
        "worker", "tests.apps.fixed_url:app", "--burst", "--url", url, "--namespace", namespace,
        "--give-up-after", "10",
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    result = run_cli("task", "result", task.id, "--url", url, "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == 5
    # Without the flag the app's own (unreachable) server is used, and the error says so.
    status = run_cli("task", "status", task.id, "--app", "tests.apps.fixed_url:app")
    assert status.returncode == 1
    assert "127.0.0.1:1" in status.stderr
    assert "Traceback" not in status.stderr


def test_invalid_runtime_schedules_are_logged_once_and_listed(
    url: str, namespace: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    app = Tether(url, namespace=namespace)
    keys = SchedulerKeys.of(namespace)
    rds.hset(keys.definitions, "broken", "{not json")

    async def two_passes() -> dict[str, str]:
        async with app:
            scheduler = Scheduler(app, loop_interval=0.2, leader_ttl=2.0)
            await scheduler.run_once()
            rds.incr(keys.version)  # a reload reads the definitions again
            await scheduler.run_once()
            await scheduler.resign()
            return await app.schedules.invalid()

    with caplog.at_level(logging.ERROR, logger="tether.scheduler"):
        invalid = asyncio.run(two_passes())
    assert list(invalid) == ["broken"]
    assert invalid["broken"].startswith("invalid definition")
    reports = [r for r in caplog.records if "broken" in r.getMessage()]
    assert len(reports) == 1, [r.getMessage() for r in reports]
    assert "invalid definition" in reports[0].getMessage()
    shown = CliRunner().invoke(
        main, ["schedules", "tests.apps.tasks:app", "--url", url, "--namespace", namespace]
    )
    assert shown.exit_code == 0, shown.output
    assert "broken" in shown.output
    assert "invalid" in shown.output


def test_dead_show_truncates_a_huge_payload_unless_asked(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    app = Tether(url, namespace=namespace)
    junk = b"\xff" + b"x" * 100_000
    rds.xadd(app.keys("default").streams[1], {"m": junk})

    async def serve() -> list[DeadLetter]:
        async with app:
            await app.worker(burst=True, scheduler=False, give_up_after=10).run()
            return await app.dead_letters("default").list()

    (letter,) = asyncio.run(serve())
    assert letter.reason
    base = ["dead", "show", letter.entry_id, "--url", url, "--namespace", namespace, "--json"]
    short = CliRunner().invoke(main, base)
    assert short.exit_code == 0, short.output
    shown = json.loads(short.output)
    assert len(shown["payload"]) == SHOWN_PAYLOAD
    assert "--full" in shown["payload_truncated"]
    assert shown["reason"] == letter.reason
    full = CliRunner().invoke(main, [*base, "--full"])
    assert len(json.loads(full.output)["payload"]) == len(junk)


def test_dead_commands_name_a_malformed_entry_id(url: str, namespace: str) -> None:
    for command in (["show", "nonsense"], ["purge", "nonsense", "--yes"]):
        done = CliRunner().invoke(main, ["dead", *command, "--url", url, "--namespace", namespace])
        assert done.exit_code == 1, done.output
        assert "'nonsense' is neither a dead-letter entry id" in done.output


def test_cancel_says_what_happened(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace)
    handle = app.enqueue_by_name_sync("tests.apps.tasks.record", "x")
    app.close_sync()
    base = ["task", "cancel", handle.id, "--url", url, "--namespace", namespace]
    first = CliRunner().invoke(main, base)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == "cancelled"
    again = CliRunner().invoke(main, base)
    assert again.output.strip() == "already finished"
