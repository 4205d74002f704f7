"""Malformed entries of every kind, written with raw XADD between good tasks: each goes to
the dead-letter stream with a reason that names the problem, and the worker keeps serving.
"""

from __future__ import annotations

import json

import pytest

from ..helpers import wait_until
from ._harness import COUNT, Chaos

pytestmark = pytest.mark.chaos


def envelope(**fields: object) -> bytes:
    base: dict[str, object] = {"v": 1, "task": COUNT, "args": ["x"], "enq": 0}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


HUGE = 4 * 1024 * 1024

MALFORMED: dict[str, tuple[dict[str, bytes], str]] = {
    # kind: (the entry's fields, a fragment of the reason)
    "junk": ({"m": b"\x00\x01 not json at all \x7f"}, "cannot be decoded by the json"),
    "huge junk": ({"m": b"{" * HUGE}, "cannot be decoded by the json"),
    "not utf-8": ({"m": '{"v": 1}'.encode("utf-16")}, "not UTF-8 text"),
    "latin-1": ({"m": '{"v":1,"task":"caf\xe9"}'.encode("latin-1")}, "not UTF-8 text"),
    "deep nesting": ({"m": b"[" * 100_000 + b"]" * 100_000}, "cannot be decoded"),
    "giant integer": ({"m": b'{"v":1,"enq":' + b"9" * 10_000 + b"}"}, "cannot be decoded"),
    "empty payload": ({"m": b""}, "cannot be decoded"),
    "no payload field": ({"x": b"1"}, "no 'm' field"),
    "a list": ({"m": b"[1, 2]"}, "is a list, not an envelope"),
    "a string": ({"m": b'"hello"'}, "is a str, not an envelope"),
    "null": ({"m": b"null"}, "is a NoneType, not an envelope"),
    "no version": ({"m": envelope(v=...)}, "unknown envelope version None"),
    "future version": ({"m": envelope(v=99)}, "unknown envelope version 99"),
    "no task": ({"m": envelope(task=...)}, "lacks the field 'task'"),
    "no args": ({"m": envelope(args=...)}, "lacks the field 'args'"),
    "unknown task": ({"m": envelope(task="nowhere.nothing")}, "unknown task 'nowhere.nothing'"),
    "task not text": ({"m": envelope(task=42)}, "wrong type"),
    "args not a list": ({"m": envelope(args={"tag": "x"})}, "wrong type"),
    "kwargs not an object": ({"m": envelope(kwargs=[1])}, "wrong type"),
    "id not text": ({"m": envelope(id=7)}, "wrong type"),
    "too many arguments": ({"m": envelope(args=["x", 1, 2, 3])}, "arguments do not fit"),
    "unknown keyword": ({"m": envelope(kwargs={"colour": "red"})}, "arguments do not fit"),
    "missing argument": ({"m": envelope(args=[])}, "arguments do not fit"),
    "wrong argument type": ({"m": envelope(args=["x", "soon"])}, "TypeError"),
    "bad attempt": ({"m": envelope(**{"try": "two"})}, "try='two' must be a whole number"),
    "bad enqueue time": ({"m": envelope(enq=-5)}, "enq=-5 must be a whole number"),
    "bad due time": ({"m": envelope(due="later")}, "due='later' must be a whole number"),
    "options not an object": ({"m": envelope(opts=[1])}, "opts=[1] must be an object"),
    "bad retries": ({"m": envelope(opts={"retries": "lots"})}, "option retries='lots'"),
    "bad timeout": ({"m": envelope(opts={"timeout": -5})}, "option timeout=-5"),
    "bad store_result": ({"m": envelope(opts={"store_result": 1})}, "option store_result=1"),
    "bad headers": ({"m": envelope(hdr={"a": 1})}, "hdr must be an object of text values"),
    "forged id": ({"m": envelope(id="default:0123456789abcdef")}, "its task id"),
}


def test_every_kind_of_malformed_entry_is_dead_lettered_with_a_reason(
    chaos: Chaos, fresh: object
) -> None:
    chaos.attach(fresh().url)  # type: ignore[operator]
    worker = chaos.worker("w", concurrency=4)
    worker.wait_ready(chaos.admin)
    streams = chaos.keys.streams
    injected: dict[bytes, str] = {}
    good: list[str] = []
    for i, (kind, (fields, _)) in enumerate(MALFORMED.items()):
        entry = chaos.admin.xadd(streams[i % 3], fields)  # type: ignore[arg-type]
        injected[entry] = kind
        good += chaos.enqueue([f"good{i}"])  # the worker serves between the bad ones
    tally = chaos.wait_all(good, timeout=30)
    chaos.wait_settled()
    letters = {fields[b"entry"]: fields for fields in chaos.dead_letters()}
    assert set(letters) == set(injected), {injected[e] for e in set(injected) - set(letters)}
    wrong = {}
    for entry, kind in injected.items():
        reason = letters[entry][b"reason"].decode()
        if MALFORMED[kind][1] not in reason:
            wrong[kind] = reason[:200]
    assert not wrong, wrong
    assert not tally.lost and tally.duplicates == 0
    # Nothing malformed ran, but for the forged id: its binding to the index is checked when
    # it settles (then nothing is written under that id), so its body has run.
    assert set(tally.runs) - set(good) <= {"x"}, set(tally.runs) - set(good)
    assert tally.starts.get("x", 0) <= 2  # the forged id, and the wrong argument type
    assert worker.alive(), worker.log()
    log = worker.log()
    assert "internal error" not in log and "crashed" not in log

    def counted() -> int:
        record = chaos.record_of(worker)
        return 0 if record is None else int(record["counters"]["dead_lettered"])

    # The record is a heartbeat old; on a mismatch the assertion shows the count.
    try:
        wait_until(lambda: counted() == len(MALFORMED), timeout=10)
    except AssertionError:
        raise AssertionError(
            f"{counted()} dead letters counted, {len(MALFORMED)} expected; {worker.log()}"
        ) from None
    print(f"\n{len(MALFORMED)} kinds of malformed entries dead-lettered; {tally}")
