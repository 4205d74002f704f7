"""The chaos harness: enqueue through the public API, count every task on the record server,
sample what each worker holds while faults hit it, and aim faults at the workers.

Connections are named through the URL (``?client_name=...``, which redis-py sends as
``CLIENT SETNAME``): the workers' are ``worker-<name>``, the test's own ``chaos-*``, so
``CLIENT KILL`` can be aimed at the workers alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tether import Tether
from tether.protocol import scripts
from tether.protocol._keys import GROUP, QueueKeys, registry_keys

from ..helpers import WorkerProcess, wait_until
from .app import entries_key, gate_key, runs_key, starts_key

COUNT = "tests.chaos.app.count"
GATED = "tests.chaos.app.gated"
DOOMED = "tests.chaos.app.doomed"
FLAKY = "tests.chaos.app.flaky"
APP = "tests.chaos.app:app"
QUEUES = ("default", "other")
"""The queues a test may use; counts and samples cover both."""


def named(url: str, name: str) -> str:
    """``url`` with a client name: the server shows it in CLIENT LIST."""
    return f"{url}{'&' if '?' in url else '?'}client_name={name}"


@dataclass(repr=False)
class Tally:
    """Every task of a run, counted: runs per tag on the record server."""

    expected: set[str]
    runs: dict[str, int]
    starts: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    """Distinct task ids (stream entries) that ran, per tag."""

    @property
    def lost(self) -> set[str]:
        return {t for t in self.expected if self.runs.get(t, 0) == 0}

    @property
    def duplicates(self) -> int:
        """Runs of one entry beyond its first, over every task: a worker's duplicates."""
        return sum(n - self.entries.get(t, 1) for t, n in self.runs.items() if t in self.expected)

    @property
    def enqueued_twice(self) -> int:
        """Extra entries of one tag: a producer's client sent the enqueue again."""
        return sum(n - 1 for t, n in self.entries.items() if t in self.expected)

    @property
    def extra(self) -> set[str]:
        """Tags that ran and were never acknowledged to the producer."""
        return set(self.runs) - self.expected

    def __repr__(self) -> str:
        return (
            f"{len(self.expected)} tasks: {len(self.lost)} lost, {self.duplicates} duplicate "
            f"runs, {self.enqueued_twice} enqueued twice, {len(self.extra)} unacknowledged ran"
        )


class Sampler:
    """Samples, every ``period`` seconds, what each worker says it holds (its registry
    record, published by the heartbeat) and what the server says each consumer owns
    (XPENDING), and keeps the maxima."""

    def __init__(self, url: str, namespace: str, period: float = 0.05) -> None:
        self._client = redis.Redis.from_url(named(url, "chaos-sampler"), socket_timeout=2)
        self._streams = [s for q in QUEUES for s in QueueKeys.of(namespace, q).streams]
        self._index, self._prefix = registry_keys(namespace)
        self._period = period
        self.max_held: dict[str, int] = {}
        self.max_owned: dict[str, int] = {}
        self.limits: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with contextlib.suppress(redis.RedisError, OSError):
                self.sample()

    def sample(self) -> None:
        client = self._client
        names = [n.decode() for n in client.zrange(self._index, 0, -1)]
        if names:
            for name, raw in zip(
                names, client.mget([self._prefix + n for n in names]), strict=True
            ):
                if raw is None:
                    continue
                record = json.loads(raw)
                self.limits[name] = int(record["max_pending"])
                held = int(record["held"])
                self.max_held[name] = max(self.max_held.get(name, 0), held)
        # One snapshot of every stream (MULTI/EXEC): read one by one, an entry settled in
        # one stream and another fetched in the next would be counted both.
        pipe = client.pipeline(transaction=True)
        for stream in self._streams:
            pipe.xpending(stream, GROUP)
        owned: dict[str, int] = {}
        for summary in pipe.execute(raise_on_error=False):
            if isinstance(summary, Exception):  # no group yet
                continue
            for row in summary.get("consumers") or []:
                name = row["name"].decode() if isinstance(row["name"], bytes) else row["name"]
                owned[name] = owned.get(name, 0) + int(row["pending"])
        for name, n in owned.items():
            self.max_owned[name] = max(self.max_owned.get(name, 0), n)
        self.samples += 1

    def assert_bounded(self) -> None:
        """No worker ever held, or was seen by the server to own, more than max_pending."""
        assert self.samples > 5, "the sampler saw nothing"
        assert self.max_held, "no worker published its record"
        for name, held in self.max_held.items():
            assert held <= self.limits[name], f"{name} held {held} > max_pending"
        for name, owned in self.max_owned.items():
            if name in self.limits:
                assert owned <= self.limits[name], f"{name} owned {owned} > max_pending"


class Chaos:
    def __init__(
        self, *, record_url: str, namespace: str, log_dir: Path, workers: list[WorkerProcess]
    ) -> None:
        self.record = redis.Redis.from_url(record_url)
        self.namespace = namespace
        self.log_dir = log_dir
        self.workers = workers
        self.keys = QueueKeys.of(namespace, "default")
        self.streams = [s for q in QUEUES for s in QueueKeys.of(namespace, q).streams]
        self.url = ""
        self._admin: redis.Redis | None = None

    def attach(self, url: str) -> None:
        """The server under test."""
        self.url = url
        if self._admin is not None:
            self._admin.close()
        self._admin = redis.Redis.from_url(named(url, "chaos-admin"), socket_timeout=5)
        self.load_scripts()

    def load_scripts(self) -> None:
        """Load every script, so the first EVALSHA of each runs (a cut aimed at a script's
        SHA would otherwise hit a NOSCRIPT reply, which changes nothing)."""
        for value in vars(scripts).values():
            if isinstance(value, scripts.Script):
                assert self.admin.script_load(value.text) == value.sha

    @property
    def admin(self) -> redis.Redis:
        assert self._admin is not None, "attach() a server first"
        return self._admin

    def close(self) -> None:
        self.record.close()
        if self._admin is not None:
            self._admin.close()

    # -- workers ------------------------------------------------------------------------

    def worker(
        self, name: str, *, url: str | None = None, extra: Sequence[str] = (), **settings: Any
    ) -> WorkerProcess:
        """A worker process; its connections are named ``worker-<name>``."""
        extra = ["--no-scheduler", *extra]
        proc = WorkerProcess(
            named(url or self.url, f"worker-{name}"),
            self.namespace,
            name,
            app=APP,
            log_dir=self.log_dir,
            extra=extra,
            **settings,
        )
        self.workers.append(proc)
        return proc

    def kill_worker_connections(self) -> int:
        """CLIENT KILL every connection of every worker; returns how many were killed."""
        killed = 0
        for client in self.admin.client_list():
            if client.get("name", "").startswith("worker-"):
                with contextlib.suppress(redis.ResponseError):  # gone meanwhile
                    self.admin.client_kill_filter(_id=client["id"])
                    killed += 1
        return killed

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log()[-3000:]}" for w in self.workers)

    # -- tasks --------------------------------------------------------------------------

    def enqueue(
        self,
        tags: Sequence[str],
        *extra: Any,
        task: str = COUNT,
        queue: str = "default",
        batch: int = 500,
        **options: Any,
    ) -> list[str]:
        """Enqueue ``task(tag, *extra)`` for each tag; returns the tags the server
        acknowledged."""

        async def send() -> list[str]:
            app = Tether(named(self.url, "chaos-producer"), namespace=self.namespace)
            fn = app.by_name(task, queue=queue)
            if options:
                fn = fn.options(**options)
            async with app:
                for start in range(0, len(tags), batch):
                    chunk = tags[start : start + batch]
                    await fn.enqueue_many([(t, *extra) for t in chunk])
            return list(tags)

        return asyncio.run(send())

    def tally(self, expected: Iterable[str]) -> Tally:
        def read(key: str) -> dict[str, int]:
            return {k.decode(): int(v) for k, v in self.record.hgetall(key).items()}

        entries: dict[str, int] = {}
        for tag in self.record.hvals(entries_key(self.namespace)):
            entries[tag.decode()] = entries.get(tag.decode(), 0) + 1
        return Tally(
            set(expected),
            read(runs_key(self.namespace)),
            read(starts_key(self.namespace)),
            entries,
        )

    def wait_all(self, expected: Iterable[str], timeout: float = 60.0) -> Tally:
        """Wait until every task ran at least once (or fail naming what is missing)."""
        expected = set(expected)
        deadline = time.monotonic() + timeout
        while True:
            tally = self.tally(expected)
            if not tally.lost:
                return tally
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{tally}; missing e.g. {sorted(tally.lost)[:5]}; pending "
                    f"{self.pending()}\n{self.logs()}"
                )
            time.sleep(0.05)

    def open_gate(self) -> None:
        self.record.set(gate_key(self.namespace), 1)

    def close_gate(self) -> None:
        self.record.delete(gate_key(self.namespace))

    # -- the server's view --------------------------------------------------------------

    def pending(self) -> int:
        total = 0
        for stream in self.streams:
            with contextlib.suppress(redis.ResponseError):
                total += int(self.admin.xpending(stream, GROUP)["pending"])
        return total

    def wait_settled(self, timeout: float = 20.0) -> None:
        """Every entry acknowledged: nothing pending, the streams empty."""

        def settled() -> bool:
            return self.pending() == 0 and sum(self.admin.xlen(s) for s in self.streams) == 0

        try:
            wait_until(settled, timeout)
        except AssertionError:
            raise AssertionError(
                f"{self.pending()} entries still pending after {timeout}s\n{self.logs()}"
            ) from None

    def dead_letters(self) -> list[dict[bytes, bytes]]:
        out = []
        for queue in QUEUES:
            out += [
                fields for _, fields in self.admin.xrange(QueueKeys.of(self.namespace, queue).dead)
            ]
        return out

    def record_of(self, worker: WorkerProcess) -> dict[str, Any] | None:
        _, prefix = registry_keys(self.namespace)
        raw = self.admin.get(prefix + worker.name)
        return None if raw is None else dict(json.loads(raw))


class Producer:
    """Enqueues small batches without pause from a thread of its own, while faults hit the
    server: keeps each acknowledged tag with the time of its acknowledgement, and counts the
    batches refused (EnqueueError: the server was away)."""

    def __init__(self, chaos: Chaos, prefix: str = "p", batch: int = 10) -> None:
        self._chaos = chaos
        self._prefix = prefix
        self._batch = batch
        self.acked: dict[str, float] = {}
        self.refused = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.run(self._produce())

    async def _produce(self) -> None:
        from tether import EnqueueError

        app = Tether(named(self._chaos.url, "chaos-producer"), namespace=self._chaos.namespace)
        fn = app.by_name(COUNT, queue="default")
        n = 0
        async with app:
            while not self._stop.is_set():
                tags = [f"{self._prefix}{n + i}" for i in range(self._batch)]
                n += self._batch
                try:
                    await fn.enqueue_many([(t,) for t in tags])
                except EnqueueError as exc:
                    self.refused += 1
                    if len(self.errors) < 3:
                        self.errors.append(str(exc))
                    await asyncio.sleep(0.05)
                    continue
                now = time.monotonic()
                for tag in tags:
                    self.acked[tag] = now
                await asyncio.sleep(0.02)
