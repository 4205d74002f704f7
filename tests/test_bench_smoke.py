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

ROOT = Path(__file__).resolve().parent.parent

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
