"""bench/api.py still runs: a small data set, three requests per endpoint. It asserts that
every endpoint of the management API answered and was measured, never how fast: timings on a
shared two-core machine say nothing in a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tether import Tether
from tether.web import create_app

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_api_bench_measures_every_endpoint(tmp_path: Path) -> None:
    command = [
        sys.executable, str(ROOT / "bench" / "api.py"),
        *("--scale", "0.02", "--requests", "3", "--results-dir", str(tmp_path)),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [path] = tmp_path.glob("api-*.json")
    data = json.loads(path.read_text())
    for scale in ("full", "tenth"):
        for name, figures in data[scale]["endpoints"].items():
            assert figures["requests"] == 3 and figures["p50_ms"] > 0, name
    # Every operation of the API's schema is in the table (by method and path).
    measured = {name.split(" (")[0].replace("…/", "") for name in data["full"]["endpoints"]}
    schema = create_app(Tether("redis://localhost:1/0"), token="x" * 16).openapi()
    operations = {
        f"{method.upper()} {path}"
        for path, methods in schema["paths"].items()
        for method in methods
    }
    named = {_generic(op) for op in operations}
    assert named <= {_generic(m) for m in _expand(measured)}, named - {
        _generic(m) for m in _expand(measured)
    }


def _expand(names: set[str]) -> set[str]:
    """'POST /a/pause, resume' stands for two operations."""
    out = set()
    for name in names:
        if ", " in name:
            head, tail = name.split(", ")
            out.add(head)
            out.add(head.rsplit("/", 1)[0] + "/" + tail)
        else:
            out.add(name)
    return out


def _generic(operation: str) -> str:
    """An operation with its path parameters unnamed: '/api/queues/{}/dead/{}'."""
    import re

    method, path = operation.split(" ", 1)
    path = path.split("?")[0]
    return method + " " + re.sub(r"\{[^}]*\}", "{}", path)
