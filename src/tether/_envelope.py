"""The message format: a versioned envelope, JSON by default.

A stream entry holds one field, ``m``, with the encoded envelope::

    {"v": 1, "task": "app.add", "args": [1, 2], "kwargs": {"z": 3}, "id": "default:9f…",
     "try": 2, "opts": {"timeout": 30}, "enq": 1732870000000}

``v``, ``task`` and ``args`` are always there; ``kwargs`` (default ``{}``), ``id`` (a plain
enqueue's id is derived from its stream entry), ``try`` (default 1) and ``opts`` (default
``{}``) are left out at their defaults.

Pickle is never the default: a payload must not be able to run code in the worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ENVELOPE_VERSION = 1


@runtime_checkable
class Serializer(Protocol):
    """Encodes envelopes and results. Must round-trip dicts, lists, str, int, float, None."""

    name: str

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerializer:
    """Compact UTF-8 JSON: safe to decode, readable in ``redis-cli``."""

    name = "json"

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
        self._decode = json.loads

    def dumps(self, obj: Any) -> bytes:
        return self._encoder.encode(obj).encode()

    def loads(self, data: bytes) -> Any:
        return self._decode(data)


class BadEnvelope(Exception):
    """An entry that cannot be run; ``reason`` goes to the dead-letter stream."""

    def __init__(self, reason: str, task_id: str = "", task: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.task_id = task_id
        self.task = task


@dataclass(slots=True)
class Envelope:
    id: str
    """'' in a plain enqueue's payload: the worker derives it from the stream entry."""
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    enqueued_ms: int
    attempt: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": ENVELOPE_VERSION, "task": self.task, "args": self.args}
        if self.kwargs:
            out["kwargs"] = self.kwargs
        if self.id:
            out["id"] = self.id
        if self.attempt != 1:
            out["try"] = self.attempt
        if self.options:
            out["opts"] = self.options
        out["enq"] = self.enqueued_ms
        return out

    def encode(self, serializer: Serializer) -> bytes:
        return serializer.dumps(self.to_dict())

    @classmethod
    def decode(cls, data: bytes | None, serializer: Serializer) -> Envelope:
        """Decode an entry's payload or raise :class:`BadEnvelope` with the reason."""
        if data is None:
            raise BadEnvelope("the entry has no 'm' field with a payload")
        try:
            raw = serializer.loads(data)
        except Exception as exc:
            raise BadEnvelope(
                f"the payload cannot be decoded by the {serializer.name} serializer: {exc}"
            ) from None
        if not isinstance(raw, Mapping):
            raise BadEnvelope(f"the payload is a {type(raw).__name__}, not an envelope object")
        raw_id, raw_task = raw.get("id") or "", raw.get("task")
        task_id = raw_id if isinstance(raw_id, str) else ""
        task = raw_task if isinstance(raw_task, str) else ""
        version = raw.get("v")
        if version != ENVELOPE_VERSION:
            raise BadEnvelope(
                f"unknown envelope version {version!r} (this worker reads {ENVELOPE_VERSION})",
                task_id,
                task,
            )
        try:
            env = cls(
                id=raw_id if isinstance(raw_id, str) else raw["id"],
                task=raw["task"],
                args=raw["args"],
                kwargs=raw.get("kwargs") or {},
                enqueued_ms=raw.get("enq", 0),
                attempt=raw.get("try", 1),
                options=raw.get("opts") or {},
            )
        except KeyError as exc:
            raise BadEnvelope(
                f"the envelope lacks the field {exc.args[0]!r}", task_id, task
            ) from None
        if not (
            isinstance(env.id, str)
            and isinstance(env.task, str)
            and isinstance(env.args, list)
            and isinstance(env.kwargs, dict)
            and isinstance(env.attempt, int)
            and isinstance(env.options, dict)
        ):
            raise BadEnvelope("the envelope has a field of the wrong type", task_id, task)
        return env


def find_unserializable(
    serializer: Serializer, named_values: Mapping[str, Any]
) -> tuple[str, Exception] | None:
    """Return the first argument the serializer refuses, with its error."""
    for name, value in named_values.items():
        try:
            serializer.dumps(value)
        except Exception as exc:
            return name, exc
    return None
