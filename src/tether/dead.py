"""The dead-letter stream of a queue: list, show, retry, purge.

Tasks land here when they fail after their last retry (status ``failed``), when their
payload cannot be run (``dead``: undecodable, unknown version, unknown task) and when they
killed too many workers (``dead``: quarantined). The stream is capped at the app's
``dead_letter_maxlen`` (10,000 by default, trimmed approximately), oldest first out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ._envelope import BadEnvelope, Envelope
from ._errors import TaskNotFound, TetherError
from ._handle import TaskHandle
from ._redis import text
from .scripts import dead_retry

if TYPE_CHECKING:
    from ._core import Core

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


def check_entry_id(entry_id: str) -> str:
    """A stream entry id (``1700000000000-0``), or a ConfigError naming the bad value."""
    from ._errors import ConfigError

    if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
        raise ConfigError(
            f"{entry_id!r} is not a dead-letter entry id (expected millis-seq, for example "
            "1700000000000-0; `tether dead list` shows them)"
        )
    return entry_id


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter entry."""

    entry_id: str
    task_id: str
    task: str
    status: str
    reason: str
    error: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""
    at: datetime | None = None
    deliveries: int = 0
    stream: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry_id": self.entry_id,
            "task_id": self.task_id,
            "task": self.task,
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "payload": self.payload.decode(errors="replace"),
            "at": self.at.isoformat() if self.at else None,
            "deliveries": self.deliveries,
            "stream": self.stream,
        }


class DeadLetters:
    """The dead-letter stream of one queue. Get one with ``app.dead_letters(queue)``."""

    def __init__(self, app: Core, queue: str) -> None:
        self.app = app
        self.queue = queue
        self.keys = app.keys(queue)

    async def count(self) -> int:
        return int(await self.app.client.xlen(self.keys.dead))

    async def list(self, count: int = 100, newest_first: bool = True) -> list[DeadLetter]:
        client = self.app.client
        rows: Any
        if newest_first:
            rows = await client.xrevrange(self.keys.dead, count=count)
        else:
            rows = await client.xrange(self.keys.dead, count=count)
        return [self._parse(entry_id, fields) for entry_id, fields in rows]

    async def show(self, entry_id: str) -> DeadLetter:
        check_entry_id(entry_id)
        rows: Any = await self.app.client.xrange(self.keys.dead, entry_id, entry_id)
        if not rows:
            raise TaskNotFound(f"no dead-letter entry {entry_id} in queue {self.queue!r}")
        return self._parse(*rows[0])

    async def retry(self, entry_id: str) -> TaskHandle[Any]:
        """Enqueue the original payload again as a fresh attempt (attempt 1, same task id)."""
        letter = await self.show(entry_id)
        try:
            env = Envelope.decode(letter.payload, self.app.serializer)
        except BadEnvelope as bad:
            raise TetherError(
                f"dead-letter entry {entry_id} cannot be retried: {bad.reason}"
            ) from None
        env.attempt = 1
        env.id = env.id or letter.task_id  # a plain enqueue's id was derived from its entry
        sidx = (
            self.keys.streams.index(letter.stream) + 1 if letter.stream in self.keys.streams else 2
        )
        reply = await dead_retry(
            self.keys, entry_id, sidx, env.id, env.encode(self.app.serializer)
        ).run(self.app.client)
        if reply is None:
            raise TaskNotFound(f"dead-letter entry {entry_id} was removed meanwhile")
        return TaskHandle(self.app, env.id, self.queue)

    async def purge(self, entry_ids: Sequence[str] | None = None) -> int:
        """Delete the given entries, or every entry when none are given."""
        client = self.app.client
        if entry_ids is None:
            n = await self.count()
            await client.delete(self.keys.dead)
            return n
        if not entry_ids:
            return 0
        for entry_id in entry_ids:
            check_entry_id(entry_id)
        return int(await client.xdel(self.keys.dead, *entry_ids))

    def _parse(self, entry_id: Any, fields: dict[bytes, bytes]) -> DeadLetter:
        payload = fields.get(b"m", b"")
        task = ""
        try:
            decoded = self.app.serializer.loads(payload)
            if isinstance(decoded, dict) and isinstance(decoded.get("task"), str):
                task = decoded["task"]
        except Exception:
            task = ""
        error: dict[str, Any] = {}
        raw_error = fields.get(b"error")
        if raw_error:
            try:
                loaded = self.app.serializer.loads(raw_error)
                error = loaded if isinstance(loaded, dict) else {"message": str(loaded)}
            except Exception:
                error = {"message": raw_error.decode(errors="replace")}
        at_ms = fields.get(b"at")
        return DeadLetter(
            entry_id=text(entry_id),
            task_id=fields.get(b"id", b"").decode(),
            task=task,
            status=fields.get(b"status", b"dead").decode(),
            reason=fields.get(b"reason", b"").decode(errors="replace"),
            error=error,
            payload=payload,
            at=datetime.fromtimestamp(int(at_ms) / 1000, tz=timezone.utc) if at_ms else None,
            deliveries=int(fields.get(b"deliveries", b"0")),
            stream=fields.get(b"queue_stream", b"").decode(),
        )
