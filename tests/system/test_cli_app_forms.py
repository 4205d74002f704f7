"""Every command takes its app the same way: ``APP`` as the first argument, the form the help
shows, and ``--app``/``-A``, its alias; before the fix, ``tether info myapp:app`` and
``tether worker --app myapp:app`` each failed with exit status 2."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import redis
from click.testing import CliRunner

from tether import Tether
from tether.cli import main

from ..helpers import ROOT

APP = "tests.apps.tasks:app"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=90,
    )  # fmt: skip


def test_the_read_commands_take_the_app_in_either_form(url: str, namespace: str) -> None:
    """A queued task, read through the app given first, as --app and as -A."""
    producer = Tether(url, namespace=namespace)
    handle = producer.enqueue_by_name_sync("tests.apps.tasks.record", "x")
    producer.close_sync()
    where = ("--url", url, "--namespace", namespace)
    for app in ([APP], ["--app", APP], ["-A", APP]):
        status = run_cli("task", "status", *app, handle.id, *where)
        assert (status.returncode, status.stdout.strip()) == (0, "queued"), status.stderr
        info = run_cli("info", *app, *where, "--json")
        assert info.returncode == 0, info.stderr
        assert '"name": "default"' in info.stdout
    # The id first and the app after it, as the docs showed before.
    after = run_cli("task", "status", handle.id, "--app", APP, *where)
    assert (after.returncode, after.stdout.strip()) == (0, "queued"), after.stderr


def test_the_dead_letter_commands_take_the_app_in_either_form(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    app = Tether(url, namespace=namespace)
    rds.xadd(app.keys("default").streams[1], {"m": b"\xffjunk"})  # unreadable: dead at once

    async def one_dead_letter() -> str:
        async with app:
            await app.worker(burst=True, scheduler=False, give_up_after=10).run()
            (letter,) = await app.dead_letters("default").list()
            return letter.entry_id

    entry = asyncio.run(one_dead_letter())
    where = ("--url", url, "--namespace", namespace)
    for app_form in ([APP], ["--app", APP], ["-A", APP]):
        shown = run_cli("dead", "show", *app_form, entry, *where, "--json")
        assert shown.returncode == 0, shown.stderr
        assert entry in shown.stdout
        listed = run_cli("dead", "list", *app_form, *where, "--json")
        assert (listed.returncode, listed.stdout.count("\n")) == (0, 1), listed.stderr
    # A list of ids after the app: the first word is the app only when it is module:attribute.
    purged = run_cli("dead", "purge", APP, entry, *where)
    assert (purged.returncode, purged.stdout.strip()) == (0, "deleted 1 entry"), purged.stderr


def test_the_worker_and_check_take_the_app_as_an_option(url: str, namespace: str) -> None:
    where = ("--url", url, "--namespace", namespace)
    worker = run_cli("worker", "-A", APP, "--burst", "--give-up-after", "10", *where)
    assert worker.returncode == 0, worker.stderr
    check = run_cli("check", APP, "--name", "nobody", *where)
    assert check.returncode == 1
    assert "worker nobody holds no lease on queue default" in check.stderr


@pytest.mark.parametrize("command", ["worker", "web", "schedules", "scheduler", "exporter",
                                     "info", "check", "dead list", "task status"])  # fmt: skip
def test_the_help_shows_the_app_as_the_first_argument(command: str) -> None:
    shown = CliRunner().invoke(main, [*command.split(), "--help"], prog_name="tether")
    assert shown.exit_code == 0
    usage = shown.output.splitlines()[0]
    assert f"tether {command} [OPTIONS] " in usage
    assert usage.split("[OPTIONS] ")[1].split()[0] in ("APP", "[APP]")
    assert "--app" not in shown.output  # the alias works, and one form is documented


TWICE = ["worker", "web", "schedules", "scheduler", "exporter --port 1", "info", "check --name w",
         "dead list"]  # fmt: skip


@pytest.mark.parametrize("command", TWICE)
def test_an_app_given_twice_differently_is_a_usage_error(command: str) -> None:
    done = CliRunner().invoke(main, [*command.split(), "a.b:app", "--app", "c.d:app"])
    assert done.exit_code == 2
    assert "the app is given twice, as 'a.b:app' and as --app 'c.d:app'" in done.output


def test_the_same_app_given_twice_is_accepted_and_a_missing_one_is_named() -> None:
    missing = CliRunner().invoke(main, ["worker"])
    assert missing.exit_code == 2
    assert "Missing argument 'APP'" in missing.output
    no_id = CliRunner().invoke(main, ["task", "status", "--app", APP])
    assert no_id.exit_code == 2
    assert "Missing argument 'TASK_ID'" in no_id.output
    twice = CliRunner().invoke(main, ["task", "status", "tests.nowhere:app", "x", "-A",
                                      "tests.nowhere:app"])  # fmt: skip
    assert twice.exit_code == 2  # past the app's check: the module cannot be imported
    assert "cannot import 'tests.nowhere'" in twice.output
