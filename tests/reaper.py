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
from pathlib import Path

MARK = "PYTEST_TETHER_RUN"
"""Not ``TETHER_*``: the suite clears those from every test's environment."""

_PROC = Path("/proc")
_held_open: list[int] = []
"""The write end of the watchdog's pipe: never closed, never inherited."""


_RUN_DIR = re.compile(r"tether-tests-(\d+)-")


def _cwd_under(pid: int, folders: list[str]) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return any(cwd == folder or cwd.startswith(folder.rstrip("/") + "/") for folder in folders)


def marked_processes() -> dict[int, str]:
    """PID -> run mark of every process that carries one (this process excepted)."""
    found: dict[int, str] = {}
    if not _PROC.is_dir():
        return found
    needle = f"{MARK}=".encode()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                found[int(entry.name)] = item[len(needle) :].decode(errors="replace")
                break
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def stop_run(mark: str, folders: list[str]) -> list[int]:
    """Stop every process of the run ``mark``: marked with it, or running in ``folders``."""
    pids = {pid for pid, found in marked_processes().items() if found == mark}
    if _PROC.is_dir():
        pids |= {
            int(entry.name)
            for entry in _PROC.iterdir()
            if entry.name.isdigit() and _cwd_under(int(entry.name), folders)
        }
    pids.discard(os.getpid())
    return [pid for pid in pids if _kill(pid)]


def stop_orphans() -> list[int]:
    """Stop what runs whose owner is gone left behind, and remove their ``TMPDIR``."""
    stopped = [
        pid for pid, mark in marked_processes().items() if not _alive(_owner(mark)) and _kill(pid)
    ]
    root = Path(tempfile.gettempdir())
    for folder in root.glob("tether-tests-*"):
        found = _RUN_DIR.match(folder.name)
        if found and not _alive(int(found.group(1))):
            stopped += stop_run("", [str(folder)])
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
    read_end, write_end = os.pipe()
    _held_open.append(write_end)
    os.set_inheritable(read_end, True)  # the write end stays ours alone: EOF means we are gone
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
