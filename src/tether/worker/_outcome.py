"""Outcomes: what a settle records for an entry, built from how its task ended."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._envelope import Serializer


@dataclass(slots=True)
class Outcome:
    """One entry's settle instruction (see scripts/settle.lua for the meaning)."""

    op: str
    """'ok', 'retry', 'fail', 'dead' or 'cancel'."""
    task_id: str = ""
    record: bytes = b""
    ttl_ms: int = 0
    a1: str | int = ""
    a2: str | bytes = ""
    result_key: str | None = None
    done_key: str | None = None
    dedup_key: str | None = None
    dedup_hold_ms: int = 0


def error_fields(exc: BaseException) -> dict[str, str]:
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def make_record(
    serializer: Serializer,
    status: str,
    task: str,
    attempt: int,
    *,
    value: Any = None,
    error: dict[str, str] | None = None,
) -> bytes:
    record: dict[str, Any] = {
        "status": status,
        "task": task,
        "attempt": attempt,
        "finished_ms": int(time.time() * 1000),
    }
    if error is not None:
        record["error"] = error
    else:
        record["value"] = value
    return serializer.dumps(record)
