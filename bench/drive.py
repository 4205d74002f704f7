"""Measure one system once: ``python -m bench.drive --system NAME ...`` (run by bench/run.py).

It runs in the system's own interpreter (its virtual environment), uses the system's normal
producer API in this process, and starts the system's documented worker command as separate
processes pinned to the worker cores. Phases, in order:

1. enqueue N tasks, one awaited call at a time (no worker running);
2. processing: start one worker, wait until it is ready, time until the N bodies have run;
3. latency at idle: the worker stays up; send probes 5 ms apart, each records its start;
4. stop the worker, close the producer, measure used_memory against the start;
5. enqueue N tasks in batches (systems with a batch call; the tasks are not run).

A multi-process row (``Spec.full`` false) fills the queue with a batch call and runs only
the processing phase, with ``Spec.workers`` worker processes.

Every phase has a time limit; a failed phase is reported and the next one still runs when
it can. The result is one JSON object written to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio

from . import procs
from .config import BATCH, Config
from .stats import Probe, command_delta
from .systems import SPECS, Spec, load
from .systems.base import Adapter

ROOT = Path(__file__).resolve().parent.parent
PROBE_GAP = 0.005
IDLE_SETTLE = 0.5
"""Seconds the worker sits idle before the latency probes, so it is blocked in its read."""
TAIL_SETTLE = 0.1
"""Seconds after the last body before the closing snapshot, so the last acknowledgements
are counted in the CPU and command figures."""


class PhaseError(Exception):
    pass


class Workers:
    """The worker processes of one phase, stopped by PID whatever happens."""

    def __init__(self, adapter: Adapter, count: int, cores: set[int] | None, logs: Path) -> None:
        self.adapter = adapter
        self.names = [f"{adapter.config.tag}-w{i}" for i in range(count)]
        self.cores = cores
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {
            **os.environ,
            **self.adapter.config.env(),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        for name in self.names:
            self.processes.append(
                procs.spawn(
                    self.adapter.worker_argv(name),
                    env=env,
                    cwd=ROOT,
                    log_path=self.logs / f"{name}.log",
                    cores=self.cores,
                )
            )

    def check_alive(self) -> None:
        for name, process in zip(self.names, self.processes, strict=True):
            if process.poll() is not None:
                raise PhaseError(
                    f"worker {name} exited with {process.returncode}:\n"
                    + procs.tail(self.logs / f"{name}.log")
                )

    def pids(self) -> list[int]:
        return [pid for p in self.processes for pid in procs.tree(p.pid)]

    def cpu(self) -> float:
        return procs.cpu_seconds(self.pids())

    def stop(self) -> list[str]:
        """Stop every worker; how each ended ('SIGTERM' is a graceful stop)."""
        endings = [procs.stop(process) for process in self.processes]
        self.processes = []
        return endings


async def timed(phase: str, limit: float, coro: Awaitable[Any]) -> Any:
    # asyncio.timeout runs the coroutine in this task, not a new one: some producers (streaq)
    # keep context variables that must be set and reset in the same context.
    try:
        if sys.version_info < (3, 11):
            return await asyncio.wait_for(coro, limit)
        async with asyncio.timeout(limit):
            return await coro
    except (TimeoutError, asyncio.TimeoutError):
        raise PhaseError(f"{phase}: no result within its limit of {limit:.0f} s") from None


async def poll(check: Callable[[], Awaitable[bool]], every: float, alive: Workers) -> int:
    polls = 0
    while True:
        polls += 1
        if await check():
            return polls
        alive.check_alive()
        await asyncio.sleep(every)


class Run:
    def __init__(self, spec: Spec, config: Config, args: argparse.Namespace, logs: Path) -> None:
        self.spec = spec
        self.config = config
        self.n: int = args.n
        self.args = args
        self.logs = logs
        self.adapter = load(spec)(config)
        self.probe = Probe(config)
        self.figures: dict[str, float | None] = {}
        self.details: dict[str, Any] = {}
        self.errors: list[str] = []
        self.workers: list[Workers] = []

    @property
    def enqueue_limit(self) -> float:
        return 30 + self.n / 200

    @property
    def processing_limit(self) -> float:
        """Worker start-up, then at least 100 tasks a second."""
        return 90 + 30 + self.n / 100

    async def phase(self, name: str, limit: float, coro: Awaitable[Any]) -> bool:
        start = time.perf_counter()
        try:
            await timed(name, limit, coro)
            return True
        except PhaseError as exc:
            self.errors.append(str(exc))
        except Exception as exc:
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            self.details.setdefault("phase_seconds", {})[name] = time.perf_counter() - start
        return False

    # -- phases ---------------------------------------------------------------------------

    async def enqueue_one_at_a_time(self) -> None:
        before = await self.probe.snapshot()
        start = time.perf_counter()
        for i in range(self.n):
            await self.adapter.enqueue(i)
        elapsed = time.perf_counter() - start
        after = await self.probe.snapshot()
        commands, setup = command_delta(before, after)
        self.figures["enqueue_rate"] = self.n / elapsed
        self.figures["enqueue_cmds"] = sum(commands.values()) / self.n
        self.details["enqueue_commands"] = commands
        self.details["enqueue_setup_commands"] = setup

    async def enqueue_batched(self, record: bool = True) -> None:
        before = await self.probe.snapshot()
        start = time.perf_counter()
        for first in range(0, self.n, BATCH):
            await self.adapter.enqueue_many(range(first, min(first + BATCH, self.n)))
        elapsed = time.perf_counter() - start
        after = await self.probe.snapshot()
        if record:
            commands, setup = command_delta(before, after)
            self.figures["enqueue_batch_rate"] = self.n / elapsed
            self.figures["enqueue_batch_cmds"] = sum(commands.values()) / self.n
            self.details["enqueue_batch_commands"] = commands
            self.details["enqueue_batch_setup_commands"] = setup

    async def start_workers(self, count: int) -> Workers:
        workers = Workers(self.adapter, count, self.args.worker_cores, self.logs)
        self.workers.append(workers)
        spawned = time.perf_counter()
        workers.start()

        async def ready() -> bool:
            return await self.adapter.ready(self.probe.client, workers.names)

        # Polled every millisecond: the moment the driver sees the signal is t0.
        await timed("worker start", 90, poll(ready, 0.001, workers))
        self.details["startup_s"] = time.perf_counter() - spawned
        return workers

    async def processing(self, count: int) -> None:
        workers = await self.start_workers(count)
        spies = self.start_profilers(workers)
        t0 = time.perf_counter()
        cpu0 = workers.cpu()
        before = await self.probe.snapshot()
        done0 = await self.probe.done()

        async def finished() -> bool:
            return await self.probe.done() >= self.n

        try:
            await timed("processing", self.processing_limit - 90, poll(finished, 0.002, workers))
        finally:
            t1 = time.perf_counter()
            for spy in spies:
                procs.stop(spy, timeout=30, sig=signal.SIGINT)  # SIGINT: py-spy writes the file
        await asyncio.sleep(TAIL_SETTLE)
        cpu1 = workers.cpu()
        after = await self.probe.snapshot()
        tasks = self.n - done0
        commands, setup = command_delta(before, after, body_incrs=tasks)
        self.figures["process_rate"] = tasks / (t1 - t0)
        self.figures["worker_cpu_us"] = (cpu1 - cpu0) / tasks * 1e6
        self.figures["server_cpu_us"] = (after.cpu - before.cpu) / tasks * 1e6
        self.figures["process_cmds"] = sum(commands.values()) / tasks
        self.details["process_commands"] = commands
        self.details["process_setup_commands"] = setup
        self.details["process_connections_opened"] = after.connections - before.connections
        self.details["process_window"] = {"tasks": tasks, "seconds": t1 - t0}

    def start_profilers(self, workers: Workers) -> list[subprocess.Popen[bytes]]:
        """With --profile: py-spy records each worker (and its children) on the driver's
        cores while it processes. The figures of a profiled run are perturbed."""
        if self.args.profile is None:
            return []
        self.args.profile_dir.mkdir(parents=True, exist_ok=True)
        spies = []
        for name, process in zip(workers.names, workers.processes, strict=True):
            svg = self.args.profile_dir / f"{self.spec.name}-{name}.svg"
            argv = [self.args.profile, "record", "--pid", str(process.pid), "--subprocesses"]
            argv += ["--rate", "250", "--output", str(svg)]
            spies.append(
                procs.spawn(
                    argv,
                    env=dict(os.environ),
                    cwd=ROOT,
                    log_path=self.logs / f"py-spy-{name}.log",
                    cores=self.args.driver_cores,
                )
            )
        self.details["profiles"] = str(self.args.profile_dir)
        return spies

    async def latency(self) -> None:
        await asyncio.sleep(IDLE_SETTLE)
        probes = self.args.probes
        sent: list[float] = []
        start = time.perf_counter()
        for k in range(probes):
            delay = start + k * PROBE_GAP - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(time.time())
            await self.adapter.enqueue(-(k + 1))

        async def all_started() -> bool:
            return await self.probe.count_starts() >= probes

        await timed("latency", 30, poll(all_started, 0.01, self.workers[-1]))
        waits = []
        for raw in await self.probe.starts():
            index, started = raw.decode().split()
            waits.append((float(started) - sent[int(index)]) * 1000)
        cuts = statistics.quantiles(waits, n=100, method="inclusive")
        self.figures["latency_p50_ms"] = statistics.median(waits)
        self.figures["latency_p99_ms"] = cuts[98]
        self.details["latency_max_ms"] = max(waits)

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        self.details["server"] = await self.probe.server_info()
        if not self.spec.full:
            if await self.phase("open", 30, self.adapter.open()):
                await self.phase("fill", self.enqueue_limit, self.enqueue_batched(record=False))
                await self.phase(
                    "processing", self.processing_limit, self.processing(self.spec.workers)
                )
            self.stop_workers()
            await self.phase("close", 30, self.adapter.close())
            return
        memory_before = await self.probe.used_memory()
        if not await self.phase("open", 30, self.adapter.open()):
            return
        ran = False
        if await self.phase("enqueue", self.enqueue_limit, self.enqueue_one_at_a_time()):
            ran = await self.phase("processing", self.processing_limit, self.processing(1))
            if ran:
                await self.phase("latency", 60 + self.args.probes * PROBE_GAP, self.latency())
        self.stop_workers()
        await self.phase("close", 30, self.adapter.close())
        await self.probe.delete_bench_keys()
        if ran:  # otherwise what is left is unprocessed tasks, not what the system keeps
            await asyncio.sleep(0.1)  # lazily freed memory goes before used_memory is read
            memory_after = await self.probe.used_memory()
            self.figures["memory_delta_kib"] = (memory_after - memory_before) / 1024
            self.details["used_memory"] = {"before": memory_before, "after": memory_after}
            self.details["leftover_keys"] = await self.leftovers()
        if self.adapter.batch and await self.phase("reopen", 30, self.adapter.open()):
            await self.phase("batch enqueue", self.enqueue_limit, self.enqueue_batched())
            await self.phase("close", 30, self.adapter.close())

    async def leftovers(self) -> dict[str, Any]:
        """What the system left in its database after the run: key count by type, a sample."""
        client = redis.asyncio.Redis.from_url(self.config.url, socket_timeout=30)
        by_type: dict[str, int] = {}
        sample: list[str] = []
        match = f"*{self.config.tag}*" if self.args.cleanup else None
        try:
            async for key in client.scan_iter(match=match, count=1000):
                kind = (await client.type(key)).decode()
                by_type[kind] = by_type.get(kind, 0) + 1
                if len(sample) < 8:
                    sample.append(f"{key.decode(errors='replace')} ({kind})")
        finally:
            await client.aclose()
        return {"count": sum(by_type.values()), "by_type": by_type, "sample": sample}

    def stop_workers(self) -> None:
        start = time.perf_counter()
        endings = [ending for workers in self.workers for ending in workers.stop()]
        if self.workers:
            self.details.setdefault("phase_seconds", {})["stop workers"] = (
                time.perf_counter() - start
            )
            self.details["workers_stopped_by"] = endings
        self.workers = []

    async def cleanup(self) -> None:
        """Delete this run's keys (only with --url: our own server is simply discarded)."""
        for db_url in (self.config.url, self.config.counter_url):
            client = redis.asyncio.Redis.from_url(db_url, socket_timeout=30)
            try:
                async for key in client.scan_iter(match=f"*{self.config.tag}*", count=1000):
                    await client.unlink(key)
            finally:
                await client.aclose()


def versions(spec: Spec) -> dict[str, str]:
    names = [r.split("==")[0].split("[")[0] for r in spec.requirements] or ["tether-queue"]
    out = {"python": sys.version.split()[0]}
    for name in [*names, "redis", "hiredis"]:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    spec = SPECS[args.system]
    config = Config(args.url, args.tag)
    os.environ.update(config.env())  # the adapter's module reads it at import
    if args.driver_cores:
        procs.pin(0, args.driver_cores)
    logs = Path(tempfile.mkdtemp(prefix=f"bench-{spec.name}-"))
    result: dict[str, Any] = {"system": spec.name, "tag": args.tag}
    run: Run | None = None
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        run = Run(spec, config, args, logs)
        await run.run()
    except Exception as exc:
        result.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
    finally:
        if run is not None:
            run.stop_workers()
            if args.cleanup:
                with contextlib.suppress(Exception):
                    await run.cleanup()
            with contextlib.suppress(Exception):
                await run.probe.close()
            result["figures"] = run.figures
            result["details"] = run.details
            result["errors"] = result.get("errors", []) + run.errors
    result["versions"] = versions(spec)
    if result.get("errors"):
        result["logs"] = str(logs)  # the workers' output, kept for a failed run
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", required=True, choices=sorted(SPECS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cleanup", action="store_true")
    parser.add_argument("--driver-cores", type=_cores, default=None)
    parser.add_argument("--worker-cores", type=_cores, default=None)
    parser.add_argument("--profile", help="py-spy executable: profile the processing phase")
    parser.add_argument("--profile-dir", type=Path, default=Path(tempfile.gettempdir()))
    return parser.parse_args(argv)


def _cores(text: str) -> set[int]:
    return {int(c) for c in text.split(",") if c}


if __name__ == "__main__":
    arguments = parse()
    outcome = asyncio.run(main(arguments))
    arguments.out.write_text(json.dumps(outcome, indent=2))
