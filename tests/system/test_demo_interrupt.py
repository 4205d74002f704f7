"""``tether demo --web`` stopped as a user stops it: Ctrl-C typed on its terminal, which
signals the terminal's whole foreground process group. The embedded server used to exit at
once with the demo, and each worker, still stopping, warned three times that it could not
reach it."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import sys
import time

from ..helpers import ROOT

CTRL_C = b"\x03"


def _read_until(fd: int, wanted: bytes, timeout: float, out: bytearray) -> bool:
    """Read the terminal into ``out`` until ``wanted`` shows, or it closes, or time is up."""
    deadline = time.monotonic() + timeout
    while wanted not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the terminal closed: the demo and its children are gone
                return False
            if not data:
                return False
            out += data
    return wanted in out


def test_ctrl_c_on_the_terminal_stops_the_demo_cleanly() -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the demo, on the terminal's side
        os.chdir(ROOT)
        os.environ["PYTHONPATH"] = str(ROOT)
        demo = ["demo", "--tasks", "200", "--workers", "2", "--web", "--web-bind", "127.0.0.1:0"]
        os.execv(sys.executable, [sys.executable, "-m", "tether", *demo])
    out = bytearray()
    try:
        assert _read_until(fd, b"press Ctrl-C to stop", 90, out), out.decode(errors="replace")
        time.sleep(1.5)  # the trickle runs: a worker is busy when the user stops it
        os.write(fd, CTRL_C)  # the terminal signals its foreground process group
        _read_until(fd, b"\x00never", 40, out)  # everything, until the terminal closes
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):  # reaped already, unless it failed
            os.kill(pid, signal.SIGKILL)
        os.close(fd)
    shown = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, shown
    assert "stopped the embedded server" in shown
    after = shown.split("press Ctrl-C to stop", 1)[1]
    assert "WARNING" not in after and "Traceback" not in after, after
