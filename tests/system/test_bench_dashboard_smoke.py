"""bench/dashboard.py still runs: a small data set (50 queues, 1,000 tasks), two requests
per page. It asserts that every page answered and was measured, never how fast: timings on
a shared two-core machine say nothing in a test (``test_dashboard_http`` checks the
commands of a live refresh exactly, on a server of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [
    "overview (50 queues)",
    "live refresh of the overview",
    "queue: running",
    "queue: scheduled",
    "queue: dead letters",
    "queue: dead letters of a task",
    "a dead letter",
    "a task",
    "workers",
    "schedules",
    "statistics, every queue",
    "statistics, one queue",
]


def test_the_dashboard_bench_measures_every_page(tmp_path: Path) -> None:
    command = [
        sys.executable, str(ROOT / "bench" / "dashboard.py"),
        *("--scale", "0.01", "--requests", "2", "--results-dir", str(tmp_path)),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == PAGES
    [path] = tmp_path.glob("dashboard-*.json")
    data = json.loads(path.read_text())
    for scale in ("full", "tenth"):
        for name in PAGES:
            page = data[scale]["pages"][name]
            assert page["requests"] == 2 and page["server_p50_ms"] > 0 and page["kib"] > 0
    assert data["full"]["counts"] == {"queued": 1000, "dead": 100, "delayed": 50}
    assert "A live refresh: " in done.stdout and " per queue." in done.stdout
