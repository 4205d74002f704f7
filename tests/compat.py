"""The compat subset proves itself: after a whole run, every Lua script must have run on the
second server kind (the machine's redis-server) at least once.

Behaviour tests run on the primary kind only; the tests marked ``compat`` run on both. Which
tests those are is a choice that can drift as scripts are added, so the run checks it: when
the session's redis-server stops, ``SCRIPT EXISTS`` tells which of Tether's scripts it ran (a
script runs by EVALSHA, or by EVAL after NOSCRIPT, and both leave it in the server's script
cache); each process (each xdist worker) writes what its server saw to a folder the run
shares, and the run fails, naming them, if any script ran on no redis-server.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import redis

from tether.protocol.scripts import _limits, _script  # noqa: F401 - _limits: its scripts register

_DIR = "PYTEST_TETHER_COMPAT_DIR"


def configure(config: pytest.Config) -> None:
    if _DIR not in os.environ:  # the run's own process: xdist workers inherit the folder
        os.environ[_DIR] = tempfile.mkdtemp(prefix="tether-compat-")
        config.pluginmanager.register(_Check(), "tether-compat-check")


def all_scripts() -> dict[str, str]:
    """SHA1 -> name of every script Tether runs."""
    return {sha: script.name for sha, script in _script._KNOWN.items()}


def record_scripts_seen(url: str) -> None:
    scripts = all_scripts()
    client = redis.Redis.from_url(url)
    try:
        shas = list(scripts)
        seen = [
            scripts[sha]
            for sha, known in zip(shas, client.script_exists(*shas), strict=True)
            if known
        ]
    finally:
        client.close()
    Path(os.environ[_DIR], f"{os.getpid()}.json").write_text(json.dumps(seen))


class _Check:
    def __init__(self) -> None:
        self.verdict: tuple[bool, str] | None = None

    @staticmethod
    def whole_run(session: pytest.Session) -> bool:
        config = session.config
        return (
            config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.option.keyword
            and config.option.markexpr == "not long"
            and not config.getoption("lf", False)
            and not config.getoption("deselect", None)
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != 0 or not self.whole_run(session):
            return
        seen: set[str] = set()
        for path in Path(os.environ[_DIR]).glob("*.json"):
            seen.update(json.loads(path.read_text()))
        names = set(all_scripts().values())
        missing = sorted(names - seen)
        if missing:
            self.verdict = (
                False,
                "compat: these scripts ran on no redis-server (mark a test that runs them "
                f"`compat`, or install redis-server): {', '.join(missing)}",
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            self.verdict = (True, f"compat: each of the {len(names)} scripts ran on redis-server")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.verdict is not None:
            passed, message = self.verdict
            terminalreporter.write_line(message, green=passed, red=not passed)
