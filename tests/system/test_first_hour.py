"""A new user's first hour (issue 18), through the real ``tether`` entry point in its own
process, against the test session's servers: the app's URL and namespace read from --app,
one-line errors with exit status 1 (``--debug`` for the traceback), dead letters named by
task id, copyable output, workers that give up, and the wording of what they log."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rich.console import Console

from tether import TaskFailed, Tether
from tether.base._embedded import free_port
from tether.cli._dead import id_table
from tether.protocol._keys import QueueKeys

from ..helpers import ROOT, WorkerProcess, eventually, running_worker, wait_until

TETHER = str(Path(sys.executable).parent / "tether")
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def tether(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user types it, without the test's TETHER_* vars."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "SHOP_"))}
    return subprocess.run(
        [TETHER, *args],
        env={**clean, "PYTHONPATH": PYTHONPATH, **(env or {})},
        capture_output=True, text=True, cwd=ROOT, timeout=90,
    )  # fmt: skip


SHOP = "tests.apps.shop:app"


@pytest.fixture
def shop(url: str, namespace: str) -> dict[str, str]:
    """The environment of the shop app: its code reads SHOP_URL and SHOP_NAMESPACE."""
    return {"SHOP_URL": url, "SHOP_NAMESPACE": namespace}


def shop_failures(shop: dict[str, str], orders: list[int], cli: bool = False) -> list[str]:
    """Enqueue failing orders in the shop app and run a burst worker (in this process, or
    ``tether worker`` with ``cli``): one dead letter each."""
    from tests.apps import shop as module

    app = module.app
    app.configure(url=shop["SHOP_URL"], namespace=shop["SHOP_NAMESPACE"])

    async def serve() -> list[str]:
        async with app:
            ids = [(await module.charge.enqueue(order)).id for order in orders]
            if not cli:
                await app.worker(burst=True, scheduler=False, give_up_after=10).run()
            return ids

    ids = asyncio.run(serve())
    if cli:
        done = tether("worker", SHOP, "--burst", "--give-up-after", "10", env=shop)
        assert done.returncode == 0, done.stderr
    return ids


# -- 1. the app's URL and namespace ------------------------------------------------------


def test_app_option_reads_the_url_and_namespace_from_the_apps_code(
    shop: dict[str, str], namespace: str, url: str
) -> None:
    """``tether dead list`` without --namespace used to print 0 entries while 3 existed."""
    ids = shop_failures(shop, [-1, -2, -3], cli=True)  # a worker that reads the code's URL too
    listed = tether("dead", "list", "--app", SHOP, "--json", env=shop)
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(line)["task_id"] for line in listed.stdout.splitlines()) == sorted(ids)
    status = tether("task", "status", ids[0], "--app", SHOP, env=shop)
    assert (status.returncode, status.stdout.strip()) == (0, "failed")
    # A typed --namespace wins over the code, and the table says where it looked.
    other = tether("dead", "list", "--app", SHOP, "--namespace", f"{namespace}x", env=shop)
    assert other.returncode == 0, other.stderr
    assert f"(namespace '{namespace}x' on {url}): 0 in all" in other.stdout
    # TETHER_URL loses to the app's code, and the CLI says so instead of ignoring it quietly.
    env_too = tether(
        "dead", "list", "--app", SHOP, "--json", env={**shop, "TETHER_URL": "redis://elsewhere/0"}
    )
    assert env_too.returncode == 0, env_too.stderr
    assert len(env_too.stdout.splitlines()) == 3
    assert "TETHER_URL is not used: tests.apps.shop:app names its own server" in env_too.stderr


def test_the_default_url_is_said_once() -> None:
    done = tether("task", "status", "nonsense")
    assert done.returncode == 1
    notes = [line for line in done.stderr.splitlines() if "using the default" in line]
    assert notes == [
        "tether: no --url, TETHER_URL or URL in the app: using the default redis://localhost:6379/0"
    ]


def test_a_task_not_found_says_where_it_was_looked_for(shop: dict[str, str]) -> None:
    (task_id,) = shop_failures(shop, [-1])
    lost = tether("task", "status", task_id, "--url", shop["SHOP_URL"])  # no --app
    assert lost.returncode == 1
    assert f"task {task_id} is unknown" in lost.stderr
    assert "(looked in namespace 'tether' on" in lost.stderr


# -- 2. one line for ordinary mistakes, the traceback with --debug ------------------------


def test_an_unreachable_server_is_one_line_and_debug_shows_the_traceback() -> None:
    where = f"redis://127.0.0.1:{free_port()}/0"
    done = tether("dead", "list", "--url", where)
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: cannot reach the server at {where} (")
    assert len(done.stderr.splitlines()) == 1
    debug = tether("dead", "list", "--url", where, "--debug")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "ConnectionError" in debug.stderr


def test_an_unknown_url_scheme_names_the_option() -> None:
    done = tether("dead", "list", "--url", "http://localhost:6379")
    assert done.returncode == 2
    assert "Invalid value for --url: url scheme 'http' is unknown" in done.stderr
    assert "Traceback" not in done.stderr
    from_env = tether("dead", "list", env={"TETHER_URL": "localhost:6379"})
    assert from_env.returncode == 2
    assert "Invalid value for TETHER_URL: url='localhost:6379': expected a URL" in from_env.stderr


def test_a_malformed_cron_keeps_crontabs_reason() -> None:
    done = tether("worker", "tests.apps.bad_cron:app", "--burst")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert (
        "importing 'tests.apps.bad_cron' failed: schedule 'tests.apps.bad_cron.tick@61 * * * *': "
        "invalid cron expression '61 * * * *': [61 * * * *] is not acceptable, out of range"
    ) in done.stderr
    debug = tether("worker", "tests.apps.bad_cron:app", "--burst", "--log-level", "DEBUG")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr


def test_ids_of_the_wrong_kind_are_named(url: str) -> None:
    for command in (["dead", "show", "12"], ["dead", "purge", "12"]):
        done = tether(*command, "--url", url)
        assert done.returncode == 1, done.stderr
        assert "Error: '12' is neither a dead-letter entry id (such as 1700000000000-0) nor a " \
            "task id" in done.stderr  # fmt: skip
        assert len(done.stderr.splitlines()) == 1
    entry_as_task = tether("task", "status", "1700000000000-0", "--url", url)
    assert entry_as_task.returncode == 1
    assert "'1700000000000-0' is a stream entry id, not a task id: task ids name their queue: " \
        "default:2-1732870000000-0" in entry_as_task.stderr  # fmt: skip


# -- 3. exit codes -----------------------------------------------------------------------


def test_retrying_or_purging_a_missing_entry_exits_non_zero(url: str, namespace: str) -> None:
    """``tether dead retry 1-0`` used to print a message and exit 0."""
    retry = tether("dead", "retry", "1-0", "--url", url, "--namespace", namespace)
    assert retry.returncode == 1
    assert retry.stderr.strip() == "1-0: no dead-letter entry 1-0 in queue 'default'"
    purge = tether("dead", "purge", "1-0", "--url", url, "--namespace", namespace)
    assert purge.returncode == 1
    assert "1-0: no such dead-letter entry in queue 'default'" in purge.stderr


def test_an_app_naming_a_missing_attribute_says_so() -> None:
    """It used to say "is NoneType, not a Tether app"."""
    done = tether("worker", "tests.apps.shop:nope")
    assert done.returncode == 2
    assert "module 'tests.apps.shop' has no attribute 'nope'" in done.stderr
    wrong = tether("dead", "list", "--app", "tests.apps.shop:charge")
    assert wrong.returncode == 2
    assert "tests.apps.shop:charge is a Task, not a Tether app" in wrong.stderr


# -- 4. dead letters by task id ----------------------------------------------------------


def test_dead_letters_are_named_by_task_id_too(shop: dict[str, str], rds: redis.Redis) -> None:
    first, second = shop_failures(shop, [-1, -2])
    shown = tether("dead", "show", first, "--app", SHOP, "--json", env=shop)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["task_id"] == first
    retried = tether("dead", "retry", first, "--app", SHOP, env=shop)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"{first}: queued again as {first}"
    status = tether("task", "status", first, "--app", SHOP, env=shop)
    assert status.stdout.strip() == "queued"
    purged = tether("dead", "purge", second, "--app", SHOP, env=shop)
    assert (purged.returncode, purged.stdout.strip()) == (0, "deleted 1 entry")
    keys = QueueKeys.of(shop["SHOP_NAMESPACE"], "default")
    assert rds.xlen(keys.dead) == 0
    gone = tether("dead", "show", second, "--app", SHOP, env=shop)
    assert gone.returncode == 1
    assert f"no dead-letter entry of task {second} in queue 'default'" in gone.stderr


def test_a_task_id_names_its_queue(shop: dict[str, str]) -> None:
    from tests.apps import shop as module

    module.app.configure(url=shop["SHOP_URL"], namespace=shop["SHOP_NAMESPACE"])
    try:
        task_id = module.invoice.enqueue_sync(-1).id
    finally:
        module.app.close_sync()
    done = tether("worker", SHOP, "--queues", "billing", "--burst", env=shop)
    assert done.returncode == 0, done.stderr
    shown = tether("dead", "show", task_id, "--app", SHOP, "--json", env=shop)  # no --queue
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["stream"].endswith(":billing}:stream:normal")
    wrong = tether("dead", "show", task_id, "--app", SHOP, "--queue", "default", env=shop)
    assert wrong.returncode == 1
    assert f"task {task_id} belongs to queue 'billing', not 'default'" in wrong.stderr


# -- 5. output that can be copied --------------------------------------------------------


def test_without_a_terminal_rows_are_not_folded(shop: dict[str, str]) -> None:
    ids = shop_failures(shop, [-1])
    listed = tether("dead", "list", "--app", SHOP, env=shop)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if ids[0] in line]
    assert re.search(r"\b\d{13}-\d+\b", row), row  # the entry id, whole, on the same line
    assert "order -1 is negative" in row


def test_ids_do_not_fold_in_a_narrow_terminal() -> None:
    task_id = "default:2-1796168957255-51"
    table = id_table(
        {"entry": ["1796168957255-5"], "task id": [task_id]}, ("entry", "task id", "reason")
    )
    table.add_row("1796168957255-5", task_id, "a long reason " * 20)
    console = Console(width=70, file=io.StringIO())
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert task_id in text
    assert "1796168957255-5" in text


def test_dead_show_prints_the_traceback_as_it_was(shop: dict[str, str]) -> None:
    """It used to print the traceback as one escaped line of JSON."""
    (task_id,) = shop_failures(shop, [-7])
    shown = tether("dead", "show", task_id, "--app", SHOP, env=shop)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"task id:    {task_id}\n" in out
    assert "\ntraceback:\nTraceback (most recent call last):\n" in out
    assert '    raise TypeError(f"order {order} is negative\\nsecond line of the message")\n' in out
    assert "TypeError: order -7 is negative\nsecond line of the message\n" in out


# -- 6, 7. workers that give up ----------------------------------------------------------


@pytest.fixture
def locked_url(server: object) -> object:
    from tether.base._embedded import EmbeddedServer

    proc = EmbeddedServer(server.process.binary, args=["--requirepass", "s3cret"]).start()  # type: ignore[attr-defined]
    yield f"redis://127.0.0.1:{proc.port}/0"
    proc.cleanup()


def test_a_wrong_password_or_a_missing_permission_stops_the_worker(locked_url: str) -> None:
    started = time.monotonic()
    wrong = tether("worker", "tests.apps.tasks:app", "--url", locked_url.replace("//", "//:no@"))
    assert wrong.returncode == 1
    assert "Error: authentication failed at redis://:***@127.0.0.1:" in wrong.stderr
    assert "no@" not in wrong.stderr
    admin = redis.Redis.from_url(locked_url, password="s3cret")
    admin.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@read"])
    admin.close()
    limited = tether(
        "worker", "tests.apps.tasks:app", "--url", locked_url.replace("//", "//reader:pw@")
    )
    assert limited.returncode == 1
    assert "the user lacks a permission at redis://reader:***@127.0.0.1:" in limited.stderr
    assert "has no permissions to run the" in limited.stderr
    assert time.monotonic() - started < 20  # neither retried


def test_a_burst_worker_gives_up_on_an_unreachable_server() -> None:
    """It used to retry for 100 s until killed."""
    started = time.monotonic()
    where = f"redis://127.0.0.1:{free_port()}/0"
    done = tether("worker", "tests.apps.tasks:app", "--burst", "--give-up-after", "1",
                  "--url", where)  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"Error: cannot reach the server at {where} ("), last
    assert last.endswith("; gave up after 1s (give_up_after)"), last
    assert time.monotonic() - started < 15


# -- 11. wording -------------------------------------------------------------------------


async def test_a_retry_runs_when_due_not_at_the_next_maintenance(app: Tether) -> None:
    """The log said "retrying in 0.18s" and the retry ran a reclaim_interval later: the worker
    now waits for the due time of a retry it scheduled itself."""
    starts: list[float] = []

    @app.task(retries=1, backoff=lambda attempt: 0.3)
    async def flaky() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise ValueError("first attempt fails")
        return "ok"

    handle = await flaky.enqueue()
    async with running_worker(app, reclaim_interval=4.0, stall_timeout=5.0):
        assert await handle.result(timeout=20) == "ok"
    gap = starts[1] - starts[0]
    assert 0.3 <= gap < 1.5, f"the retry started {gap:.2f}s after the failure"


async def test_removed_dead_consumers_are_logged_at_debug(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """ "removed 1 dead consumers" came at INFO after every burst run."""

    @app.task
    async def job() -> None:
        return None

    keys = QueueKeys.of(app.namespace, "default")
    await job.enqueue()
    # A consumer that left nothing behind and holds no lease, as a killed worker leaves it.
    rds.xgroup_create(keys.stream("normal"), "tether", id="0")
    rds.xgroup_createconsumer(keys.stream("normal"), "tether", "long-gone")
    caplog.set_level(logging.DEBUG, "tether")
    await app.worker(burst=True, scheduler=False, give_up_after=10).run()
    (record,) = [r for r in caplog.records if "dead consumer" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == "removed 1 dead consumer from queue default"


async def test_a_task_handed_off_at_the_end_of_the_grace_is_worded_plainly(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """It said "handed off 1 still running after shutdown_grace entries"."""

    @app.task
    async def slow() -> None:
        import asyncio

        await asyncio.sleep(30)

    caplog.set_level(logging.INFO, "tether")
    handle = await slow.enqueue()
    async with running_worker(app, shutdown_grace=0.2) as worker:
        await eventually(lambda: worker.running)
    assert (
        "handed off 1 entry (still running when the shutdown grace ended) to other workers"
        in caplog.text
    )
    keys = QueueKeys.of(app.namespace, "default")
    (pending,) = rds.xpending_range(keys.stream("normal"), "tether", "-", "+", 10)
    assert pending["consumer"] == b"abandoned"  # any worker takes it up at once
    assert handle.id.endswith(pending["message_id"].decode())


async def test_an_idle_worker_says_it_ran_nothing(
    app: Tether, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tether")
    worker = app.worker(burst=True, scheduler=False, give_up_after=10)
    await worker.run()
    assert f"worker {worker.name} stopped: no tasks" in caplog.text


async def test_an_unstorable_result_follows_the_retry_policy(app: Tether, rds: redis.Redis) -> None:
    """A result that cannot be serialized is a failure like any other: retried per policy,
    then dead-lettered and counted as failed."""

    @app.task(retries=1, backoff=lambda attempt: 0.05)
    async def odd() -> object:
        return object()

    handle = await odd.enqueue()
    async with running_worker(app) as worker:
        with pytest.raises(TaskFailed, match="cannot be serialized"):
            await handle.result(timeout=10)
        assert (worker.counters.retried, worker.counters.failed) == (1, 1)
        assert worker.counters.succeeded == 0
    keys = QueueKeys.of(app.namespace, "default")
    ((_, fields),) = rds.xrange(keys.dead)
    assert fields[b"reason"].startswith(b"failed on attempt 2 of 2 (no retries left)")


# -- 12. enqueue by name, checked by the worker -------------------------------------------


async def test_a_task_enqueued_by_an_unknown_name_is_dead_lettered_by_the_worker(
    app: Tether, rds: redis.Redis
) -> None:
    @app.task
    async def known(x: int) -> int:
        return x

    producer = Tether(app.settings.url, namespace=app.namespace)  # imports no task module
    async with producer:
        typo = await producer.enqueue_by_name("tests.nobody.knows", 1)
        good = await producer.by_name(known.name).options(priority="high", retries=1).enqueue(7)
    async with running_worker(app):
        assert await producer_result(app, good.id) == 7
        with pytest.raises(TaskFailed) as failed:
            await app.handle(typo.id).result(timeout=10)
    assert failed.value.status == "dead"
    keys = QueueKeys.of(app.namespace, "default")
    ((_, fields),) = rds.xrange(keys.dead)
    assert fields[b"reason"].decode() == (
        "unknown task 'tests.nobody.knows': this worker has no task registered by that name"
    )


async def producer_result(app: Tether, task_id: str) -> object:
    return await app.handle(task_id).result(timeout=10)


# -- 14. a health check for orchestrators ------------------------------------------------


def test_tether_check_exits_non_zero_once_the_lease_is_gone(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    proc = WorkerProcess(url, namespace, "pod-7", log_dir=tmp_path, queues="default,other")
    workers.append(proc)
    proc.wait_ready(rds)
    base = ["check", "--name", "pod-7", "--url", url, "--namespace", namespace]
    alive = tether(*base)  # the queues come from the worker's registry record
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith(
        "worker pod-7 is alive: it holds its lease on queue default, other"
    )
    assert tether(*base, "--queues", "other").returncode == 0
    wrong = tether(*base, "--queues", "default,elsewhere")
    assert wrong.returncode == 1
    assert "worker pod-7 holds no lease on queue elsewhere" in wrong.stderr
    proc.kill_now()
    wait_until(lambda: not rds.exists(proc.lease_key()), timeout=10)
    dead = tether(*base, "--queues", "default")
    assert dead.returncode == 1
    assert "worker pod-7 holds no lease on queue default" in dead.stderr
    assert "it is dead, stopped, or stalled" in dead.stderr


# -- 15. docs ----------------------------------------------------------------------------


def test_every_task_context_field_is_documented() -> None:
    import dataclasses

    from tether import TaskContext

    text = (ROOT / "docs" / "tasks.md").read_text()
    table = text.split("## The task's context", 1)[1].split("```python", 1)[0]
    for field in dataclasses.fields(TaskContext):
        assert f"`{field.name}`" in table, f"TaskContext.{field.name} is not in docs/tasks.md"
