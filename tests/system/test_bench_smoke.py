"""The benchmark suite still runs: a small run of Tether and the floor, one round.

It asserts that the run finished and produced every figure, never how fast anything was:
timings on a shared two-core machine say nothing in a test. It starts its own embedded
server (the bench does) and needs no peer's virtual environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

FIGURES = [
    "enqueue_rate",
    "enqueue_batch_rate",
    "process_rate",
    "latency_p50_ms",
    "latency_p99_ms",
    "worker_cpu_us",
    "process_cmds",
    "enqueue_cmds",
    "enqueue_batch_cmds",
    "memory_delta_kib",
]


def test_a_small_bench_run_produces_every_figure(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "bench" / "run.py"),
        *("--n", "200", "--rounds", "1", "--probes", "20"),
        *("--systems", "tether,floor", "--results-dir", str(tmp_path)),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

    [json_path] = tmp_path.glob("*.json")
    [md_path] = tmp_path.glob("*.md")
    data = json.loads(json_path.read_text())
    assert data["meta"]["n"] == 200
    for name in ("tether", "floor"):
        system = data["systems"][name]
        assert system["errors"] == [], system["errors"]
        for key in FIGURES:
            figure = system["figures"].get(key)
            assert figure is not None, f"{name} has no {key}"
            assert figure["median"] is not None
            assert figure["min"] <= figure["median"] <= figure["max"]
        # The floor is its own reference.
        assert system["figures"]["process_rate"]["vs_floor"] is not None

    table = md_path.read_text()
    assert "| Tether |" in table and "| floor (bare redis-py) |" in table
    assert table in done.stdout


def test_the_sync_enqueue_bench_runs(url: str) -> None:
    """bench/sync_enqueue.py prints its table (figures are never asserted)."""
    command = [
        sys.executable,
        str(ROOT / "bench" / "sync_enqueue.py"),
        *("--url", url, "--batch", "80", "--pairs", "2", "--threads", "1,8"),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| 1 |", "| 8 |"))]
    assert len(rows) == 2 and all(line.count("/s") == 2 for line in rows), done.stdout


def test_the_sizing_bench_runs(url: str) -> None:
    """bench/sizing.py prints a row per kind of task (figures are never asserted)."""
    command = [sys.executable, str(ROOT / "bench" / "sizing.py"), "--url", url, "--n", "100"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| queued", "| ran"))]
    assert len(rows) == 6 and all(line.count("|") == 6 for line in rows), done.stdout
    # The rows that run tasks give the run's commands with statistics off and on.
    for line in [*rows, *(x for x in done.stdout.splitlines() if x.startswith("| failed"))]:
        *_, off, on, _ = line.split("|")
        assert bool(off.strip()) == bool(on.strip()) == line.startswith(("| ran", "| failed"))
