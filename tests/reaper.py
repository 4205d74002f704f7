"""No server or worker outlives the test run that started it, however the run ends.

A process the run started is known by one of two signs: it inherited
``PYTEST_TETHER_RUN=<owner pid>:<run id>`` from the session's environment (workers, CLI and
HTTP processes, xdist's own workers), or it runs in a folder of the run (a server: it starts in
its data folder, made under the run's ``TMPDIR`` or pytest's base temporary folder; a server
rewrites its process title over its environment, so the first sign is gone from it).

A small watchdog, in its own session so a Ctrl-C in the terminal does not reach it, holds the
read end of a pipe whose write end only the run's process holds: when the run ends (normally,
by SIGTERM or SIGINT, or SIGKILLed) the pipe reads EOF and the watchdog stops every process
with either sign, then removes the run's ``TMPDIR``. A run also stops, when it starts, what
earlier runs whose owner is gone left behind. Linux only: elsewhere it does nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MARK = "PYTEST_TETHER_RUN"
"""Not ``TETHER_*``: the suite clears those from every test's environment."""

_PROC = Path("/proc")
_RUN_DIR = re.compile(r"tether-tests-(\d+)-")


@dataclass(frozen=True)
class Process:
    pid: int
    mark: str | None
    """The run mark it inherited, if any."""
    cwd: str | None
    """Its working folder, if readable."""

    def under(self, folders: list[str]) -> bool:
        return self.cwd is not None and any(
            self.cwd == folder or self.cwd.startswith(folder.rstrip("/") + "/")
            for folder in folders
        )


def processes() -> Iterator[Process]:
    """Every process but this one, with its run mark and working folder (one pass of /proc)."""
    if not _PROC.is_dir():
        return
    needle = f"{MARK}=".encode()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            environ = b""  # gone, or not ours to read
        try:
            cwd: str | None = os.readlink(entry / "cwd")
        except OSError:
            cwd = None
        mark = next(
            (item[len(needle) :].decode(errors="replace") for item in environ.split(b"\0")
             if item.startswith(needle)),
            None,
        )  # fmt: skip
        yield Process(int(entry.name), mark, cwd)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie is gone in all but name (its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int) -> bool:
    """SIGKILL, after SIGCONT: a frozen process dies as well."""
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _owner(mark: str) -> int:
    head = mark.split(":", 1)[0]
    return int(head) if head.isdigit() else 0


def stop_run(mark: str | None, folders: list[str]) -> list[int]:
    """Stop every process of a run: marked with ``mark``, or running in ``folders``."""
    return [
        p.pid
        for p in processes()
        if ((mark is not None and p.mark == mark) or p.under(folders)) and _kill(p.pid)
    ]


def stop_orphans() -> list[int]:
    """Stop what runs whose owner is gone left behind, and remove their ``TMPDIR``."""
    stopped = [
        p.pid
        for p in processes()
        if p.mark is not None and not alive(_owner(p.mark)) and _kill(p.pid)
    ]
    for folder in Path(tempfile.gettempdir()).glob("tether-tests-*"):
        found = _RUN_DIR.match(folder.name)
        if found and not alive(int(found.group(1))):
            stopped += stop_run(None, [str(folder)])
            shutil.rmtree(folder, ignore_errors=True)
    return stopped


def start(basetemp: Path) -> str | None:
    """Mark this run, give it its own ``TMPDIR``, stop what dead runs left, and start the
    watchdog; the run's mark. ``basetemp``: pytest's base temporary folder of the run."""
    if MARK in os.environ or not _PROC.is_dir():
        return os.environ.get(MARK)  # an xdist worker, or a run inside a run: the owner watches
    leftovers = stop_orphans()
    if leftovers:
        sys.stderr.write(f"stopped {len(leftovers)} processes left by an earlier test run\n")
    mark = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
    run_dir = tempfile.mkdtemp(prefix=f"tether-tests-{os.getpid()}-")
    # The write end stays open in this process alone (not inheritable, never closed): EOF on
    # the read end means this process is gone.
    read_end, _ = os.pipe()
    os.set_inheritable(read_end, True)
    devnull = os.open(os.devnull, os.O_RDWR)
    # posix_spawn, not Popen: no object whose collection would warn that the child still runs.
    os.posix_spawn(
        sys.executable,
        [sys.executable, "-c", _WATCHDOG, mark, str(read_end), run_dir, str(basetemp)],
        dict(os.environ),
        file_actions=[(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)],
        setsid=True,  # a Ctrl-C in the terminal reaches the run, not its watchdog
    )
    os.close(read_end)
    os.close(devnull)
    os.environ[MARK] = mark
    os.environ["TMPDIR"] = run_dir  # the servers' data folders, and every other temporary file
    tempfile.tempdir = None
    return mark


_WATCHDOG = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
mark, fd, folders = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
while os.read(fd, 1):
    pass
import shutil
from tests.reaper import stop_run
stop_run(mark, folders)
shutil.rmtree(folders[0], ignore_errors=True)
"""
