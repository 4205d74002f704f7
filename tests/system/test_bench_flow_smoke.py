"""bench/flow.py still runs: a small run of every row, one round. It asserts that the run
finished and reported every row, never how fast anything was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_flow_control_bench_reports_every_row() -> None:
    command = [sys.executable, str(ROOT / "bench" / "flow.py"), "--n", "200"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    labels = [r.split(" | ")[0].removeprefix("| ") for r in rows]
    assert labels[0] == "unlimited"
    assert labels[1] == "rate limit 500/s, far below the worker's rate"
    assert labels[2].startswith("rate limit 10x the unlimited rate (limit ")
    assert labels[3:] == [
        "concurrency limit 320 (10x the worker's 32)",
        "per-key concurrency limit 320, 8 keys",
    ]
    for row in rows:
        rate = row.split(" | ")[1].replace(",", "")
        assert float(rate) > 0, row
