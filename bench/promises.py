"""Figures for the delivery promises and the lifecycle, with default settings.

    python3 bench/promises.py            # about 3 minutes
    python3 bench/promises.py --quick    # fewer runs

Prints, in markdown: the time from SIGKILL to the task restarting on another worker (idle
stream), the time for a SIGTERM handoff to be picked up, the Redis commands leases and reclaim
add at steady state, the commands results and retries add per task, the precision of delayed
starts, and the scheduler's failover time and load per schedule. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import envs  # noqa: E402  (standard library only)

envs.run_with_this_tether(__file__)

import redis  # noqa: E402

from tether.base._embedded import EmbeddedServer, stop_process  # noqa: E402

APP = "bench.apps.promises:app"


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(0.002)


class Bench:
    def __init__(self, server: EmbeddedServer, log_dir: Path) -> None:
        self.server = server
        self.url = server.url
        self.log_dir = log_dir
        self.client = redis.Redis.from_url(self.url)
        self.n = 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def namespace(self) -> str:
        self.n += 1
        return f"p{self.n}"

    def env(self, namespace: str) -> dict[str, str]:
        return {
            **os.environ,
            "TETHER_URL": self.url,
            "TETHER_NAMESPACE": namespace,
            "PYTHONPATH": str(ROOT),
        }

    def worker(self, namespace: str, name: str, *extra: str) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "tether", "worker", APP, "--name", name,
                "--log-level", "WARNING", "--no-scheduler", *extra]  # fmt: skip
        with open(self.log_dir / f"{namespace}-{name}.log", "ab") as log:
            proc = subprocess.Popen(args, env=self.env(namespace), stdout=log, stderr=log, cwd=ROOT)
        self.procs.append(proc)
        lease = f"{{{namespace}:default}}:lease:{name}"
        wait_until(lambda: self.client.exists(lease), 30, f"worker {name} ready")
        return proc

    def scheduler(self, namespace: str, n: int) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "tether", "scheduler", APP, "--log-level", "WARNING"]
        with open(self.log_dir / f"{namespace}-scheduler-{n}.log", "ab") as log:
            proc = subprocess.Popen(args, env=self.env(namespace), stdout=log, stderr=log, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def enqueue(self, namespace: str, task: str, *calls: tuple[Any, ...], **options: Any) -> None:
        from bench.apps import promises
        from tether import Task, Tether

        async def send() -> None:
            app = Tether(self.url, namespace=namespace)
            source = promises.app.tasks[f"bench.apps.promises.{task}"]
            fn: Task[..., Any] = Task(app, source.fn, source.config)
            if options:
                fn = fn.options(**options)
            async with app:
                await fn.enqueue_many(list(calls))

        asyncio.run(send())

    def notes(self, namespace: str, key: str) -> list[tuple[str, int, float]]:
        out = []
        for raw in self.client.lrange(f"{namespace}:{key}", 0, -1):
            task_id, pid, at = raw.decode().split("|")
            out.append((task_id, int(pid), float(at)))
        return out

    def server_time(self) -> float:
        seconds, micros = self.client.time()
        return seconds + micros / 1e6

    def commands(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    def stop_all(self) -> None:
        for proc in self.procs:
            stop_process(proc, wait=15)
        self.procs.clear()


@contextmanager
def measuring(bench: Bench) -> Iterator[dict[str, int]]:
    delta: dict[str, int] = {}
    before = bench.commands()
    yield delta
    after = bench.commands()
    for name, calls in after.items():
        if calls - before.get(name, 0):
            delta[name] = calls - before.get(name, 0)


def kill_to_restart(bench: Bench, runs: int) -> list[float]:
    """SIGKILL a worker running a task; an idle second worker restarts it."""
    out = []
    for _ in range(runs):
        ns = bench.namespace()
        a = bench.worker(ns, "a")
        bench.enqueue(ns, "long", (300.0,))
        wait_until(lambda ns=ns: bench.notes(ns, "starts"), 10, "first start")
        b = bench.worker(ns, "b")
        time.sleep(0.5)
        killed = bench.server_time()
        a.send_signal(signal.SIGKILL)
        a.wait()
        wait_until(lambda ns=ns: len(bench.notes(ns, "starts")) == 2, 30, "restart")
        out.append(bench.notes(ns, "starts")[1][2] - killed)
        bench.stop_all()
        del b
    return out


def handoff_pickup(bench: Bench, runs: int) -> list[float]:
    """SIGTERM a worker holding buffered entries; another worker starts them."""
    out = []
    for _ in range(runs):
        ns = bench.namespace()
        a = bench.worker(ns, "a", "--concurrency", "1", "--max-pending", "5")
        bench.enqueue(ns, "long", *[(2.0,)] * 5)
        wait_until(lambda ns=ns: bench.notes(ns, "starts"), 10, "first start")
        time.sleep(0.2)
        bench.worker(ns, "b", "--concurrency", "8")
        time.sleep(0.5)
        sent = bench.server_time()
        a.send_signal(signal.SIGTERM)
        wait_until(lambda ns=ns: len(bench.notes(ns, "starts")) == 5, 30, "handoff pickup")
        out.append(max(at for _, _, at in bench.notes(ns, "starts")[1:]) - sent)
        bench.stop_all()
    return out


def idle_overhead(bench: Bench, seconds: float) -> dict[str, float]:
    """Commands per second that one idle worker (one queue) spends on leases and reclaim."""
    ns = bench.namespace()
    bench.worker(ns, "idle")
    time.sleep(2)
    with measuring(bench) as delta:
        time.sleep(seconds)
    bench.stop_all()
    return {k: v / seconds for k, v in sorted(delta.items()) if k not in ("info",)}


def per_task_commands(bench: Bench, task: str, n: int, *calls: tuple[Any, ...]) -> float:
    ns = bench.namespace()
    bench.enqueue(ns, task, *([calls[0] if calls else ()] * n))
    with measuring(bench) as delta:
        bench.worker(ns, "w", "--concurrency", "32")
        keys = [f"{{{ns}:default}}:stream:{p}" for p in ("high", "normal", "low")]
        wait_until(
            lambda: (
                sum(bench.client.xlen(k) for k in keys) == 0
                and not bench.client.zcard(f"{{{ns}:default}}:delayed")
            ),
            120,
            f"{task} drained",
        )
        time.sleep(0.3)
    bench.stop_all()
    total = sum(v for k, v in delta.items() if k not in ("info", "exists", "rpush", "time"))
    return total / n


def delayed_precision(bench: Bench, n: int) -> dict[str, float]:
    """Lateness of delayed starts on an idle queue (server clock), default settings."""
    ns = bench.namespace()
    bench.worker(ns, "w", "--concurrency", "32")
    time.sleep(1)
    due: dict[str, float] = {}
    from bench.apps import promises
    from tether import Task, Tether

    async def send() -> None:
        app = Tether(bench.url, namespace=ns)
        src = promises.app.tasks["bench.apps.promises.on_time"]
        fn: Task[..., Any] = Task(app, src.fn, src.config)
        async with app:
            for i in range(n):
                delay = 0.2 + (i % 50) * 0.07  # 0.2 s to 3.6 s: below and above reclaim_interval
                t0 = bench.server_time()
                handle = await fn.options(delay=delay).enqueue()
                due[handle.id] = t0 + delay
                await asyncio.sleep(0.01)

    asyncio.run(send())
    wait_until(lambda: len(bench.notes(ns, "on_time")) == n, 60, "delayed tasks")
    bench.stop_all()
    late = sorted((at - due[task_id]) * 1000 for task_id, _, at in bench.notes(ns, "on_time"))
    late_known = sorted(
        (at - due[t]) * 1000 for t, _, at in bench.notes(ns, "on_time") if due[t] - at < -1.2
    )
    return {
        "p50": statistics.median(late),
        "p99": late[int(len(late) * 0.99) - 1],
        "max": late[-1],
        "min": late[0],
    } | ({"p50 due > 1.2 s after enqueue": statistics.median(late_known)} if late_known else {})


def scheduler_failover(bench: Bench, runs: int) -> list[float]:
    """Kill the leader among three scheduler processes; time until another leads."""
    out = []
    for _ in range(runs):
        ns = bench.namespace()
        procs = [bench.scheduler(ns, i) for i in range(3)]
        key = f"{{{ns}:scheduler}}:leader"
        leader = wait_until(lambda key=key: bench.client.get(key), 30, "a leader")
        victim = next(p for p in procs if f"-{p.pid}:".encode() in leader)
        time.sleep(1)
        killed = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        wait_until(
            lambda key=key, leader=leader: (v := bench.client.get(key)) and v != leader,
            30,
            "takeover",
        )
        out.append(time.monotonic() - killed)
        bench.stop_all()
    return out


def scheduler_load(bench: Bench, schedules: int, seconds: float) -> dict[str, float]:
    ns = bench.namespace()
    from bench.apps import promises
    from tether import Tether

    async def add() -> None:
        app = Tether(bench.url, namespace=ns)
        app.tasks.update(promises.app.tasks)
        async with app:
            for i in range(schedules):
                await app.schedules.add(promises.tick, every=1.0, name=f"s{i}")

    asyncio.run(add())
    bench.scheduler(ns, 0)
    wait_until(lambda: bench.client.get(f"{{{ns}:scheduler}}:leader"), 30, "a leader")
    time.sleep(3)
    with measuring(bench) as delta:
        time.sleep(seconds)
    bench.stop_all()
    per_second = sum(v for k, v in delta.items() if k != "info") / seconds
    return {"commands/s": per_second, "per schedule per s": per_second / schedules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = 2 if args.quick else 5
    with EmbeddedServer() as server:
        bench = Bench(server, Path(server.directory))
        try:
            results: dict[str, Any] = {}
            results["kill_to_restart_s"] = kill_to_restart(bench, runs)
            results["handoff_pickup_s"] = handoff_pickup(bench, runs)
            results["idle_worker_commands_per_s"] = idle_overhead(bench, 10 if args.quick else 30)
            n = 2000 if args.quick else 5000
            results["commands_per_task"] = {
                "no result stored": per_task_commands(bench, "noop", n),
                "result stored": per_task_commands(bench, "noop_with_result", n),
                "one retry (fails once)": per_task_commands(bench, "fails_once", n // 5, ("x",)),
            }
            results["delayed_lateness_ms"] = delayed_precision(bench, 100 if args.quick else 300)
            results["scheduler_failover_s"] = scheduler_failover(bench, 2 if args.quick else 3)
            results["scheduler_load"] = scheduler_load(bench, 100, 5 if args.quick else 15)
        finally:
            bench.stop_all()
    print(render(results))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"promises-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps(results, indent=2)
    )


def render(r: dict[str, Any]) -> str:
    def spread(values: list[float]) -> str:
        median = statistics.median(values)
        return (
            f"median {median:.2f} s (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
        )

    def pairs(values: dict[str, float], digits: int) -> str:
        return ", ".join(f"{k} {v:.{digits}f}" for k, v in values.items())

    rows = [
        ("SIGKILL to restart elsewhere, idle stream (defaults)", spread(r["kill_to_restart_s"])),
        ("SIGTERM handoff picked up by another worker", spread(r["handoff_pickup_s"])),
        ("idle worker, one queue: commands per second", pairs(r["idle_worker_commands_per_s"], 2)),
    ]
    for name, value in r["commands_per_task"].items():
        rows.append((f"commands per task, processing: {name}", f"{value:.2f}"))
    rows.append(("delayed start lateness, server clock (ms)", pairs(r["delayed_lateness_ms"], 1)))
    rows.append(("scheduler leader failover (leader_ttl 10 s)", spread(r["scheduler_failover_s"])))
    load = r["scheduler_load"]
    rows.append(
        (
            "scheduler load, 100 one-second schedules",
            f"{load['commands/s']:.0f} commands/s, {load['per schedule per s']:.2f} per schedule/s",
        )
    )
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


if __name__ == "__main__":
    main()
