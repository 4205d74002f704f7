"""A TCP proxy between worker processes and a server that cuts connections on command.

Threads, not asyncio: the chaos tests drive worker *processes* from plain synchronous code.
Each client connection gets one upstream connection and two pump threads. The proxy can

- :meth:`cut` every connection at once (both sides closed, whatever is in flight);
- :meth:`cut_on` a command: when a request containing a pattern (a script's SHA1, so the
  cut lands in the middle of one protocol step) passes through, either drop the request
  unsent, or send it and drop the connection as soon as the reply arrives, so the server
  did the work and the worker never learns it (the hard case);
- name the upstream addresses it opened, for ``CLIENT KILL ADDR`` from the server side.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Trigger:
    pattern: bytes
    times: int
    lose: str
    """'request': the command never reaches the server; 'reply': it runs, its reply is lost."""
    fired: int = 0


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket
    drop_reply: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class Proxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._triggers: list[_Trigger] = []
        self._stopped = False
        self.cuts = 0
        """Connections cut so far (by :meth:`cut` or a trigger)."""
        self.connections = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, **query: str) -> str:
        tail = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
        return f"redis://127.0.0.1:{self.port}/0{tail}"

    # -- faults -------------------------------------------------------------------------

    def cut(self) -> int:
        """Drop every open connection; returns how many."""
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)
        return len(pairs)

    def cut_on(self, pattern: bytes, *, times: int = 1, lose: str = "reply") -> _Trigger:
        """Cut the connection that carries the next ``times`` requests containing
        ``pattern``."""
        assert lose in ("request", "reply")
        trigger = _Trigger(pattern, times, lose)
        with self._lock:
            self._triggers.append(trigger)
        return trigger

    def upstream_addresses(self) -> list[str]:
        """'host:port' of each open upstream connection, as CLIENT LIST shows them."""
        out = []
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            with contextlib.suppress(OSError):
                host, port = pair.upstream.getsockname()[:2]
                out.append(f"{host}:{port}")
        return out

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    # -- plumbing -----------------------------------------------------------------------

    def _drop(self, pair: _Pair) -> None:
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.discard(pair)
            self.cuts += 1
        pair.close()

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        pair.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.add(pair)
                self.connections += 1
            threading.Thread(target=self._requests, args=(pair,), daemon=True).start()
            threading.Thread(target=self._replies, args=(pair,), daemon=True).start()

    def _match(self, data: bytes) -> _Trigger | None:
        with self._lock:
            for trigger in self._triggers:
                if trigger.fired < trigger.times and trigger.pattern in data:
                    trigger.fired += 1
                    return trigger
        return None

    def _requests(self, pair: _Pair) -> None:
        try:
            while True:
                data = pair.client.recv(65536)
                if not data:
                    break
                trigger = self._match(data)
                if trigger is not None and trigger.lose == "request":
                    self._drop(pair)
                    return
                if trigger is not None:
                    pair.drop_reply = True
                pair.upstream.sendall(data)
        except OSError:
            pass
        self._forget(pair)

    def _replies(self, pair: _Pair) -> None:
        try:
            while True:
                data = pair.upstream.recv(65536)
                if not data:
                    break
                if pair.drop_reply:
                    self._drop(pair)
                    return
                pair.client.sendall(data)
        except OSError:
            pass
        self._forget(pair)
