"""The message format: a versioned envelope, JSON by default.

A stream entry holds one field, ``m``, with the encoded envelope::

    {"v": 1, "task": "app.add", "args": [1, 2], "kwargs": {"z": 3}, "id": "default:9f…",
     "try": 2, "opts": {"timeout": 30}, "enq": 1732870000000, "due": 1732870005000,
     "hdr": {"traceparent": "00-…"}}

``v``, ``task`` and ``args`` are always there; ``kwargs`` (default ``{}``), ``id`` (a plain
enqueue's id is derived from its stream entry), ``try`` (default 1), ``opts`` (default
``{}``), ``due`` (when a delayed or retried task became due, unix ms) and ``hdr`` (headers
set by middleware, such as a trace context) are left out at their defaults.

Fields are only ever added, never changed in meaning, within one envelope version: a worker
ignores the fields it does not know, so workers of an earlier release read newer envelopes
(they ignore ``due`` and ``hdr``), and the version changes only for an incompatible format.

Pickle is never the default: a payload must not be able to run code in the worker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..base._errors import TetherError

ENVELOPE_VERSION = 1


@runtime_checkable
class Serializer(Protocol):
    """Encodes envelopes and results. Must round-trip dicts, lists, str, int, float, None."""

    name: str

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


def compact_json_encoder() -> Callable[[Any], str]:
    """``JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode``, the same text, with
    the C encoder built once instead of at every call (most of the cost of a small envelope:
    about 6 of 7 us here). It keeps no circular-reference markers, which a shared encoder
    could not keep thread-safe: a value that contains itself fails with RecursionError
    instead of ValueError, an ArgumentSerializationError for the caller either way."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the _json accelerator
        return encoder.encode
    chunks = make(
        None, encoder.default, json.encoder.encode_basestring, None, ":", ",", False, False, True
    )

    def encode(obj: Any) -> str:
        return "".join(chunks(obj, 0))

    return encode


class JsonSerializer:
    """Compact UTF-8 JSON: safe to decode, readable in ``redis-cli``."""

    name = "json"
    text = True
    """Payloads are UTF-8 text: anything else is refused with that reason."""

    def __init__(self) -> None:
        self._encode = compact_json_encoder()
        self._decode = json.loads

    def dumps(self, obj: Any) -> bytes:
        return self._encode(obj).encode()

    def loads(self, data: bytes) -> Any:
        # Strict UTF-8 here (json.loads would also take UTF-16 and UTF-32), in the same pass
        # that decoding the bytes costs json.loads anyway.
        return self._decode(data.decode() if type(data) is bytes else data)


PlainEncoder = Callable[[tuple[Any, ...], Mapping[str, Any], int], bytes]
"""Encodes one plain task (no id, no due time, no headers) from (args, kwargs, enqueued ms)."""


def plain_encoder(
    serializer: Serializer, task: str, options: Mapping[str, Any]
) -> PlainEncoder | None:
    """For the JSON serializer, an encoder of a plain task's envelope that writes its fixed
    parts once: the same bytes as encoding the whole envelope, at the cost of the arguments
    only (the blocking fast path of ``enqueue_sync``). None for other serializers."""
    if type(serializer) is not JsonSerializer:
        return None
    dumps = serializer._encode
    head = f'{{"v":{ENVELOPE_VERSION},"task":{dumps(task)},"args":'
    tail = (f',"opts":{dumps(dict(options))}' if options else "") + ',"enq":'

    def encode(args: tuple[Any, ...], kwargs: Mapping[str, Any], enqueued_ms: int) -> bytes:
        # A tuple encodes as the list it becomes; **kwargs is always a dict.
        if kwargs:
            return f'{head}{dumps(args)},"kwargs":{dumps(kwargs)}{tail}{enqueued_ms}}}'.encode()
        return f"{head}{dumps(args)}{tail}{enqueued_ms}}}".encode()

    return encode


class BadEnvelope(TetherError):
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
    due_ms: int | None = None
    headers: dict[str, str] | None = None
    extra: dict[str, Any] | None = None
    """Fields this release does not know (from a newer producer, or an integration such as
    the taskiq broker): kept as they are when the envelope is written again."""
    started_ms: int | None = None
    """When this attempt started in this worker (unix ms), for its outcome record; never
    written into a payload."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra) if self.extra else {}
        out.update({"v": ENVELOPE_VERSION, "task": self.task, "args": self.args})
        if self.kwargs:
            out["kwargs"] = self.kwargs
        if self.id:
            out["id"] = self.id
        if self.attempt != 1:
            out["try"] = self.attempt
        if self.options:
            out["opts"] = self.options
        if self.headers:
            out["hdr"] = self.headers
        out["enq"] = self.enqueued_ms
        if self.due_ms is not None:
            out["due"] = self.due_ms
        return out

    def encode(self, serializer: Serializer) -> bytes:
        return serializer.dumps(self.to_dict())

    @classmethod
    def decode(cls, data: bytes | None, serializer: Serializer) -> Envelope:
        """Decode an entry's payload or raise :class:`BadEnvelope` with the reason."""
        if data is None:
            raise BadEnvelope("the entry has no 'm' field with a payload")
        text = getattr(serializer, "text", False)
        if text and type(serializer) is not JsonSerializer:
            _require_utf8(data, serializer)  # JsonSerializer.loads refuses it by itself
        try:
            raw = serializer.loads(data)
        except UnicodeDecodeError as exc:
            if not text:
                raise BadEnvelope(
                    f"the payload cannot be decoded by the {serializer.name} serializer: {exc}"
                ) from None
            raise BadEnvelope(_not_utf8(exc, data, serializer)) from None
        except Exception as exc:
            raise BadEnvelope(
                f"the payload cannot be decoded by the {serializer.name} serializer: {exc}"
            ) from None
        if type(raw) is not dict:
            if not isinstance(raw, Mapping):
                raise BadEnvelope(f"the payload is a {type(raw).__name__}, not an envelope object")
            raw = dict(raw)
        raw_id, raw_task = raw.get("id") or "", raw.get("task")
        version = raw.get("v")
        if version != ENVELOPE_VERSION:
            raise BadEnvelope(
                f"unknown envelope version {version!r} (this worker reads {ENVELOPE_VERSION})",
                *_names(raw_id, raw_task),
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
                due_ms=raw.get("due"),
                headers=raw.get("hdr") or None,
                # Most payloads hold only known fields: no copy to make.
                extra=None
                if raw.keys() <= _KNOWN
                else {k: v for k, v in raw.items() if k not in _KNOWN},
            )
        except KeyError as exc:
            raise BadEnvelope(
                f"the envelope lacks the field {exc.args[0]!r}", *_names(raw_id, raw_task)
            ) from None
        if not (
            isinstance(env.id, str)
            and isinstance(env.task, str)
            and isinstance(env.args, list)
            and isinstance(env.kwargs, dict)
        ):
            raise BadEnvelope(
                "the envelope has a field of the wrong type (id, task: text; args: a list; "
                "kwargs: an object)",
                *_names(raw_id, raw_task),
            )
        # The plain case (first attempt, no options, due time or headers) checks one field.
        attempt, enqueued_ms = env.attempt, env.enqueued_ms
        problem = (
            (None if attempt == 1 and type(attempt) is int else _check_int("try", attempt, 1))
            or (None if not env.options else _check_options(env.options))
            or (
                None
                if type(enqueued_ms) is int and enqueued_ms >= 0
                else _check_int("enq", enqueued_ms, 0)
            )
            or (None if env.due_ms is None else _check_int("due", env.due_ms, 0))
            or (None if env.headers is None else _check_headers(env.headers))
        )
        if problem:
            raise BadEnvelope(f"the envelope is malformed: {problem}", *_names(raw_id, raw_task))
        return env


def _names(raw_id: object, raw_task: object) -> tuple[str, str]:
    """The task id and name a malformed envelope gives, where they are text (for the dead
    letter)."""
    return (
        raw_id if isinstance(raw_id, str) else "",
        raw_task if isinstance(raw_task, str) else "",
    )


def _not_utf8(exc: UnicodeDecodeError, data: bytes, serializer: Serializer) -> str:
    return (
        f"the payload is not UTF-8 text ({exc.reason} at byte {exc.start} of {len(data)}), "
        f"so the {serializer.name} serializer cannot read it"
    )


def _require_utf8(data: bytes, serializer: Serializer) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadEnvelope(_not_utf8(exc, data, serializer)) from None


_KNOWN = frozenset({"v", "task", "args", "kwargs", "id", "try", "opts", "enq", "due", "hdr"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int) -> str | None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        return f"{name}={value!r} must be a whole number, {minimum} or more"
    return None


def _positive_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


BACKOFF_SPEC = re.compile(
    r"[1-9][0-9]{0,12}\|[0-9]{1,3}(\.[0-9]{1,12})?\|[1-9][0-9]{0,12}\|[1-9][0-9]{0,12}"
)
"""A schedule's failure backoff as its runs carry it (ScheduleBackoff.spec)."""

_OPTION_CHECKS: dict[str, tuple[Any, str]] = {
    "timeout": (_positive_number, "a number of seconds above zero"),
    "retries": (lambda v: _is_int(v) and v >= 0, "a whole number, 0 or more"),
    "store_result": (lambda v: isinstance(v, bool), "true or false"),
    "key": (lambda v: isinstance(v, str) and 0 < len(v) <= 512, "text of 1 to 512 characters"),
    "key_ttl": (_positive_number, "a number of seconds above zero"),
    "limit_key": (
        lambda v: isinstance(v, str) and 0 < len(v) <= 200,
        "text of 1 to 200 characters",
    ),
    "schedule": (
        lambda v: isinstance(v, str) and 0 < len(v) <= 200 and "|" not in v,
        "a schedule name (1 to 200 characters without '|')",
    ),
    "tick": (_is_int, "a whole number"),
    "backoff": (
        lambda v: isinstance(v, str) and BACKOFF_SPEC.fullmatch(v) is not None,
        "'<initial ms>|<factor>|<cap ms>|<forget ms>'",
    ),
}


def _check_options(options: object) -> str | None:
    if not isinstance(options, dict):
        return f"opts={options!r} must be an object"
    for name, value in options.items():
        check = _OPTION_CHECKS.get(name)
        if check is not None and not check[0](value):
            return f"option {name}={value!r} must be {check[1]}"
    return None


def _check_headers(headers: object) -> str | None:
    if headers is None:
        return None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        return "hdr must be an object of text values"
    return None


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
