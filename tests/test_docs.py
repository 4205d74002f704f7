"""Every Python example in README.md and docs/ runs, against the test server.

A block preceded by `<!-- not-runnable -->` is a fragment and is skipped; a block preceded by
`<!-- output: TEXT -->` must print TEXT.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)


def examples() -> list[tuple[str, str, str]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            marker = (match.group("marker") or "").strip()
            if marker == "not-runnable":
                continue
            expected = (
                marker.removeprefix("output:").strip() if marker.startswith("output:") else ""
            )
            out.append((f"{path.name}#{i + 1}", match.group("code"), expected))
    return out


@pytest.mark.parametrize(("where", "code", "expected"), examples(), ids=[e[0] for e in examples()])
def test_example_runs(
    url: str, namespace: str, tmp_path: Path, where: str, code: str, expected: str
) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"
    if expected:
        assert expected in done.stdout, f"{where} printed:\n{done.stdout}"
