"""The compat check fails a whole run in which a script ran on no redis-server, naming it.

A run of its own (pytest in a subprocess, with the suite's conftest as a plugin) over one
compat test that runs a single script on both server kinds: the run's tests pass, and the run
fails all the same, naming the scripts that never ran on redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..helpers import ROOT
from ..reaper import MARK

INNER_TEST = """
import pytest
import redis

from tether.protocol import scripts

pytestmark = pytest.mark.compat


def test_one_script(server):
    client = redis.Redis.from_url(server.url)
    try:
        client.eval(scripts.STATUS.text, 0)
    except redis.ResponseError:
        pass  # no keys for it: it fails, and the server has cached it all the same
    client.close()
"""


def test_a_whole_run_that_leaves_a_script_out_fails_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_inner.py").write_text(INNER_TEST)
    env = {k: v for k, v in os.environ.items() if k not in (MARK, "PYTEST_TETHER_COMPAT_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    # The suite's own configuration and conftest, over the inner folder: a whole run of it.
    command = [
        sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "tests.conftest",
        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "testpaths=inner",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout
    assert "ran on no redis-server" in done.stdout
    named = done.stdout.split("ran on no redis-server")[1]
    assert "settle" in named and "enqueue" in named
    assert "status" not in named.split(":", 1)[1], "a script that ran is named as missing"
