"""Retry and purge every dead letter of a queue: one run, whoever asks (``tether dead retry
--all``, ``tether dead purge``, the API, the dashboard). A run takes the letters present when
it began, a page at a time: any number of them in the same memory and a few round trips a
page, and a letter that arrives meanwhile (a retried task that failed again) is left for the
next run."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from click.testing import CliRunner

from tether import Tether
from tether.cli import main
from tether.dead import SCAN_BUDGET, total_of
from tether.protocol._keys import QueueKeys, known_queues_key
from tether.web import create_app
from tether.web.pages import _dead as dead_pages

from ..conftest import PRIMARY_KIND, start_server
from ..web_helpers import TOKEN, serving

MB = 1024 * 1024
MEMORY_OF_A_RUN = 40 * MB
"""The most a run may add to the memory of the ``tether`` process: it holds one page of
letters (and added nothing measurable). Holding the 100,000 letters at once (the command
listed them all first) added 190 to 250 MB."""


@pytest.fixture(scope="module")
def quiet_url() -> Iterator[str]:
    """A server of this module's own: the commands it counts are the tests' alone."""
    server = start_server(PRIMARY_KIND)
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture
def quiet(quiet_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(quiet_url)
    yield client
    client.close()


def add_letters(
    rds: redis.Redis, namespace: str, count: int, *, first: int = 0, task: str = "ops.fail"
) -> None:
    """``count`` letters as the settle script writes a task that failed its last attempt,
    each of a task id of its own, by pipelined XADD."""
    keys = QueueKeys.of(namespace, "default")
    stream = keys.stream("normal")
    failure = json.dumps({"type": "ValueError", "message": "bad row", "traceback": "..."})
    pipe = rds.pipeline(transaction=False)
    for n in range(first, first + count):
        task_id = f"default:{n:032x}"
        payload = {"v": 1, "task": task, "args": [n], "id": task_id, "try": 3, "enq": 1}
        pipe.execute_command(
            "XADD", keys.dead, "*", "m", json.dumps(payload), "id", task_id, "status",
            "failed", "reason", "failed after 3 attempts", "error", failure,
            "queue_stream", stream, "entry", "1-0", "deliveries", 1, "at", 1_700_000_000_000,
        )  # fmt: skip
        if len(pipe) == 10_000:
            pipe.execute()
    pipe.execute()


def spent(rds: redis.Redis, before: Counter[str] | None = None) -> Counter[str]:
    """The server's command calls by name (a script's own commands included) and its socket
    reads (``reads``: a command alone takes one, a pipeline of many a few); less ``before``."""
    counts = Counter(
        {name.removeprefix("cmdstat_"): stats["calls"]
         for name, stats in rds.info("commandstats").items()}
    )  # fmt: skip
    counts["reads"] = rds.info("stats")["total_reads_processed"]
    if before is not None:
        counts.subtract(before)
    return counts


@dataclass
class Ran:
    code: int
    out: str
    err: str
    peak: int
    """The process's peak resident memory, in bytes."""


def tether(tmp_path: Path, url: str, namespace: str, *args: str) -> Ran:
    """The real ``tether`` command in a process of its own, and its peak memory."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tether", *args], stdout=stdout, stderr=stderr, env=env
        )
        watchdog = threading.Timer(100, process.kill)  # wait4 itself has no timeout
        watchdog.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            watchdog.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    return Ran(process.returncode, out.read_text(), err.read_text(), usage.ru_maxrss * 1024)


def test_retry_all_takes_100000_letters_once_a_page_at_a_time(
    quiet: redis.Redis, quiet_url: str, namespace: str, tmp_path: Path
) -> None:
    """It listed every letter (up to a million), then retried them one round trip each:
    for these 100,000, 190 MB more memory, 200,000 round trips and 40 s instead of 4."""
    letters = 100_000
    add_letters(quiet, namespace, letters)
    keys = QueueKeys.of(namespace, "default")
    idle = tether(tmp_path, quiet_url, namespace, "dead", "list", "-n", "1")
    assert idle.code == 0, idle.err
    before = spent(quiet)
    ran = tether(tmp_path, quiet_url, namespace, "dead", "retry", "--all")
    used = spent(quiet, before)

    assert (ran.code, ran.err) == (0, ""), ran.err[-2000:]
    assert ran.out == f"retried {letters} entries of queue 'default'\n"
    # Each letter once: the dead stream is empty, and the queue holds one entry per task id.
    assert quiet.xlen(keys.dead) == 0
    assert quiet.xlen(keys.stream("normal")) == quiet.hlen(keys.index) == letters
    pages = math.ceil(letters / SCAN_BUDGET)
    # The retry script reads its own letter (one XRANGE each); the command reads a page with
    # one more, and sends the page's scripts in one pipeline.
    assert used["xrange"] - letters <= pages + 1, used
    assert used["reads"] <= letters // 10, used
    grown = ran.peak - idle.peak
    assert grown < MEMORY_OF_A_RUN, f"{grown / MB:.0f} MB more than `tether dead list -n 1`"


def test_purge_deletes_every_letter_a_page_at_a_time(
    quiet: redis.Redis, quiet_url: str, namespace: str, tmp_path: Path
) -> None:
    """It deleted the whole stream (with the letters that arrived after the count)."""
    letters = 20_000
    add_letters(quiet, namespace, letters)
    idle = tether(tmp_path, quiet_url, namespace, "dead", "list", "-n", "1")
    before = spent(quiet)
    ran = tether(tmp_path, quiet_url, namespace, "dead", "purge", "--yes")
    used = spent(quiet, before)

    assert (ran.code, ran.out, ran.err) == (0, f"deleted {letters} entries\n", "")
    assert quiet.xlen(QueueKeys.of(namespace, "default").dead) == 0
    pages = math.ceil(letters / SCAN_BUDGET)
    # A page read, a page deleted: never the whole stream at once (DEL).
    assert pages <= used["xdel"] <= pages + 1 and used["xrange"] <= pages + 1, used
    assert used["del"] == 0, used
    grown = ran.peak - idle.peak
    assert grown < MEMORY_OF_A_RUN, f"{grown / MB:.0f} MB more than `tether dead list -n 1`"


async def test_a_run_leaves_the_letters_that_arrive_meanwhile(
    app: Tether, rds: redis.Redis, namespace: str
) -> None:
    present = 2 * SCAN_BUDGET + 500  # three pages
    add_letters(rds, namespace, present)
    letters = app.dead_letters("default")

    run = letters.retry_all()
    first = await anext(run)
    add_letters(rds, namespace, 7, first=present)  # retried tasks that failed again
    rest = await total_of(run)
    assert (len(first.done), rest.done, rest.failed, rest.cursor) == (SCAN_BUDGET, 1500, 0, None)
    assert await letters.count() == 7

    # Cut short (the dashboard's time budget), a run goes on from its cursor.
    add_letters(rds, namespace, present, first=10_000, task="ops.flaky")
    cut = await total_of(letters.purge_all("ops.flaky"), seconds=0)
    assert 0 < cut.done < present and cut.cursor is not None
    add_letters(rds, namespace, 3, first=20_000, task="ops.flaky")
    rest = await total_of(letters.purge_all("ops.flaky", cursor=cut.cursor))
    assert cut.done + rest.done == present and rest.cursor is None
    left = Counter(letter.task for letter in await letters.list(count=100))
    assert left == {"ops.fail": 7, "ops.flaky": 3}


def test_retry_all_prints_each_letter_it_could_not_retry(
    rds: redis.Redis, url: str, namespace: str
) -> None:
    add_letters(rds, namespace, 3)
    dead = QueueKeys.of(namespace, "default").dead
    unreadable = [rds.xadd(dead, {"m": b"{not json", "id": "x"}).decode() for _ in range(2)]
    cli = ["dead", "retry", "--url", url, "--namespace", namespace]

    ran = CliRunner().invoke(main, [*cli, "--all"])
    assert ran.exit_code == 1
    assert ran.stdout == "retried 3 entries of queue 'default'; 2 could not be retried\n"
    lines = ran.stderr.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == unreadable
    assert all("cannot be retried: the payload cannot be decoded" in line for line in lines)
    assert rds.xlen(dead) == 2

    both = CliRunner().invoke(main, [*cli, "--all", unreadable[0]])
    assert both.exit_code == 2 and "not both" in both.stderr


async def test_the_api_and_the_dashboard_run_through_every_letter_alike(
    rds: redis.Redis, url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rds.zadd(known_queues_key(namespace), {"default": 0})
    add_letters(rds, namespace, 5)
    web = create_app(Tether(url, namespace=namespace), token=TOKEN)
    base = "/api/queues/default/dead"
    with serving(web) as address:
        async with httpx.AsyncClient(base_url=address, timeout=30) as http:
            api = {"Authorization": f"Bearer {TOKEN}"}
            # The API: a page a call, by cursor; the arrivals after the first call stay.
            page = (await http.post(f"{base}/retry", json={"all": True, "limit": 2},
                                    headers=api)).json()  # fmt: skip
            add_letters(rds, namespace, 4, first=100)
            retried = len(page["done"])
            while page["cursor"]:
                body = {"all": True, "limit": 2, "cursor": page["cursor"]}
                page = (await http.post(f"{base}/retry", json=body, headers=api)).json()
                retried += len(page["done"])
            assert retried == 5 and not page["failed"]
            # Purge all: one call, every letter present, counted.
            purged = (await http.post(f"{base}/purge", json={"all": True}, headers=api)).json()
            assert purged == {"count": 4, "done": [], "task_ids": {}, "failed": {},
                              "cursor": None}  # fmt: skip

            # The dashboard: the same run, within its time budget, then on another press.
            await http.post("/login", data={"token": TOKEN, "next": "/"})
            found = re.search(r'name="csrf_token" value="([^"]+)"', (await http.get("/")).text)
            assert found
            form = {"csrf_token": found.group(1), "scope": "all", "task": "",
                    "next": "/queues/default/dead"}  # fmt: skip

            async def press(action: str) -> str:
                shown = await http.post(f"/queues/default/dead/{action}", data=form,
                                        follow_redirects=True)  # fmt: skip
                flash = re.search(r'<p class="flash[^>]*>([^<]*)</p>', shown.text)
                assert flash, shown.text[:500]
                return flash.group(1)

            add_letters(rds, namespace, SCAN_BUDGET + 10, first=200)
            with monkeypatch.context() as patch:
                patch.setattr(dead_pages, "BULK_SECONDS", 0.0)  # stops after one page
                first = await press("retry")
            assert first == "Retried 1,000 dead letters; more remain: press again to go on."
            assert await press("retry") == "Retried 10 dead letters."
            add_letters(rds, namespace, 3, first=2000)
            assert await press("purge") == "Purged 3 dead letters."
    assert rds.xlen(QueueKeys.of(namespace, "default").dead) == 0
