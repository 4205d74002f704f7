"""Processes: start pinned to cores, read their CPU time, stop them by PID.

Standard library only: the driver imports this in every system's virtual environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def core_plan() -> tuple[set[int], set[int]]:
    """(driver cores, worker cores). With two cores or more the worker processes get every
    core but the first, and the driver and the server share the first, so the worker never
    competes with the process that feeds it. With one core nothing is pinned."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    return {cores[0]}, set(cores[1:])


def pin(pid: int, cores: set[int]) -> None:
    """Pin a process we started (0 = this one); children it starts later inherit it."""
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, cores)


def spawn(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    cores: set[int] | None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output in ``log_path``, pinned to ``cores``.

    The pin is set right after the start rather than between fork and exec (a preexec_fn is
    unsafe in a process with threads, and asyncio resolves addresses in threads): the child
    is still importing then, and the processes it starts later inherit the pin."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if cores:
        pin(process.pid, cores)
    return process


def _parent_map() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        parents[int(entry)] = int(fields[1])
    return parents


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a worker CLI may run its worker in a child)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children.get(current, [])
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of these processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLOCK_TICKS


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(process: subprocess.Popen[bytes], timeout: float = 5.0, sig: int = signal.SIGTERM) -> str:
    """Send ``sig`` (SIGTERM) to ``process``, SIGKILL it after ``timeout``; then SIGKILL any
    descendant still alive shortly after. Every signal goes to a PID this run started (or a
    child of one). Returns how it ended: 'exited', the signal's name, or 'SIGKILL'."""
    if process.poll() is not None:
        return "exited"
    family = [pid for pid in tree(process.pid) if pid != process.pid]
    how = signal.Signals(sig).name
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        how = "SIGKILL"
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    deadline = time.monotonic() + 2
    while any(_alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in family:
        if _alive(pid):
            how = "SIGKILL"
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return how


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
