"""The observability rows of the bench still run: `tether-metrics` and `tether-otel` in a
small run of bench/run.py, and bench/observability.py --quick. Figures, never how fast:
timings on a shared two-core machine say nothing in a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_metrics_and_tracing_rows_produce_their_figures(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "bench" / "run.py"),
        *("--n", "200", "--rounds", "1", "--probes", "20"),
        *("--systems", "tether-metrics,tether-otel", "--results-dir", str(tmp_path)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    [json_path] = tmp_path.glob("*.json")
    systems = json.loads(json_path.read_text())["systems"]
    # Metrics are the worker's alone: that row measures processing only.
    expected = {
        "tether-metrics": ["process_rate", "worker_cpu_us", "process_cmds"],
        "tether-otel": ["enqueue_rate", "enqueue_batch_rate", "process_rate", "latency_p50_ms",
                        "worker_cpu_us", "enqueue_cmds"],
    }  # fmt: skip
    for name, figures in expected.items():
        assert systems[name]["errors"] == [], systems[name]["errors"]
        for key in figures:
            assert systems[name]["figures"][key]["median"] is not None, (name, key)


def test_the_in_process_measurements_run() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "observability.py"), "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = done.stdout.splitlines()[1:]
    assert len(rows) == 9, done.stdout
    for what in ("AttemptTally.record", "process span per run", "worker CPU per task, tracing"):
        assert any(what in row for row in rows), what
