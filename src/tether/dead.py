"""The dead-letter stream of a queue: list, show, retry, purge.

Entries are named by their entry id (``1700000000000-0``, as ``list`` shows them) or by the
task id the application kept (``default:2-1700000000000-0``, ``default:9f2c…``): the
newest entry of that task is shown or retried, and every entry of it purged.

Tasks land here when they fail after their last retry (status ``failed``), when their
payload cannot be run (``dead``: undecodable, unknown version, unknown task) and when they
killed too many workers (``dead``: quarantined). The stream is capped at the app's
``dead_letter_maxlen`` (10,000 by default, trimmed approximately), oldest first out.
"""

from __future__ import annotations

import builtins
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from .admin._models import Page
from .base._blocking import run_blocking
from .base._errors import ConfigError, TaskNotFound, TetherError
from .base._redis import text
from .base._unreadable import parsed, skip
from .producer._handle import TaskHandle
from .protocol._envelope import BadEnvelope, Envelope
from .protocol._keys import queue_of_task_id
from .protocol.scripts import Call, dead_retry

if TYPE_CHECKING:
    from .producer._core import Core

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_PAGE = 1000
SCAN_BUDGET = 1000
"""Entries a filtered page or a bulk call reads at most: it returns a cursor to go on."""


_Row = tuple[Any, dict[bytes, bytes]]
T = TypeVar("T")
"""A stream entry as redis-py reads it: its id, and its fields."""

_BULK_CURSOR = re.compile(r"^(\d{1,20}-\d{1,20})~(\d{1,20}-\d{1,20})$")


def _bulk_cursor(cursor: str) -> tuple[str, str]:
    match = _BULK_CURSOR.match(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise ConfigError(
            f"cursor {cursor!r} is not the cursor of a bulk call (<entry id>~<entry id>: pass "
            "back the cursor the previous call returned)"
        )
    return match.group(1), match.group(2)


def check_entry_id(entry_id: str) -> str:
    """A stream entry id (``1700000000000-0``), or a ConfigError naming the bad value."""
    if not is_entry_id(entry_id):
        raise ConfigError(
            f"{entry_id!r} is not a dead-letter entry id (expected millis-seq, for example "
            "1700000000000-0; `tether dead list` shows them)"
        )
    return entry_id


def is_entry_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ENTRY_ID.match(value))


def is_task_id(value: object) -> bool:
    """Looks like a task id: ``<queue>:<stream>-<entry id>`` or ``<queue>:<32 hex>``."""
    if not isinstance(value, str):
        return False
    try:
        queue_of_task_id(value)
    except ValueError:
        return False
    return True


def check_reference(value: str) -> str:
    """An entry id or a task id, or a ConfigError naming both forms."""
    if is_entry_id(value) or is_task_id(value):
        return value
    raise ConfigError(
        f"{value!r} is neither a dead-letter entry id (such as 1700000000000-0) nor a task id "
        "(such as default:2-1700000000000-0 or default:<32 hex digits>); `tether dead list` "
        "shows both"
    )


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
        """The entry as JSON-ready values (``tether dead list --json`` prints them)."""
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


@dataclass(frozen=True)
class Bulk:
    """What one bulk call did. Call again with ``cursor`` until it is None."""

    done: list[str]
    """The entries retried or purged."""
    failed: dict[str, str]
    """Entries that could not be retried: entry id -> why."""
    handles: dict[str, str] = field(default_factory=dict)
    """Retried entries: entry id -> the task id queued again."""
    cursor: str | None = None


@dataclass
class BulkTotal:
    """What a run of bulk calls did in all (:meth:`DeadLetters.retry_all`,
    :meth:`DeadLetters.purge_all`). Only counts and the first failure are kept: a run over
    any number of letters holds one page of them at a time."""

    done: int = 0
    """Entries retried or purged."""
    failed: int = 0
    """Entries that could not be retried."""
    first_failure: str = ""
    """Why the first of them could not be."""
    cursor: str | None = None
    """Where the run stopped when it was cut short; None when it went to its end."""

    def add(self, bulk: Bulk) -> None:
        self.done += len(bulk.done)
        self.failed += len(bulk.failed)
        if bulk.failed and not self.first_failure:
            self.first_failure = next(iter(bulk.failed.values()))
        self.cursor = bulk.cursor


async def total_of(
    pages: AsyncGenerator[Bulk, None],
    each: Callable[[Bulk], object] | None = None,
    seconds: float | None = None,
) -> BulkTotal:
    """Go through the pages of a run, calling ``each`` with every page (to report its
    failures as they come, or to audit it): the totals. With ``seconds``, stop after the
    page that outlasts them; the total's cursor then goes on from there."""
    total = BulkTotal()
    deadline = None if seconds is None else time.monotonic() + seconds
    async with aclosing(pages):
        async for bulk in pages:
            if each is not None:
                each(bulk)
            total.add(bulk)
            if deadline is not None and time.monotonic() > deadline:
                break
    return total


class DeadLetters:
    """The dead-letter stream of one queue. Get one with ``app.dead_letters(queue)``."""

    def __init__(self, app: Core, queue: str) -> None:
        self.app = app
        self.queue = queue
        self.keys = app.keys(queue)

    async def count(self) -> int:
        """The entries in the stream now."""
        return int(await self.app.client.xlen(self.keys.dead))

    async def list(self, count: int = 100, newest_first: bool = True) -> list[DeadLetter]:
        """Up to ``count`` entries, newest first unless ``newest_first`` is False."""
        client = self.app.client
        rows: Any
        if newest_first:
            rows = await client.xrevrange(self.keys.dead, count=count)
        else:
            rows = await client.xrange(self.keys.dead, count=count)
        return [self._parse(entry_id, fields) for entry_id, fields in rows]

    async def show(self, ref: str) -> DeadLetter:
        """The entry ``ref`` names: an entry id, or a task id (its newest entry)."""
        if is_entry_id(ref):
            rows: Any = await self.app.client.xrange(self.keys.dead, ref, ref)
            if not rows:
                raise TaskNotFound(f"no dead-letter entry {ref} in queue {self.queue!r}")
            return self._parse(*rows[0])
        letters = await self.find(ref)
        if not letters:
            raise TaskNotFound(f"no dead-letter entry of task {ref} in queue {self.queue!r}")
        return letters[0]

    async def find(self, task_id: str) -> builtins.list[DeadLetter]:
        """The entries of the task ``task_id``, newest first (applications keep task ids,
        not entry ids). Reads the stream page by page: it is capped at
        ``dead_letter_maxlen`` entries."""
        self._check_task_id(task_id)
        found: builtins.list[DeadLetter] = []
        wanted = task_id.encode()
        end = "+"
        while True:
            rows: Any = await self.app.client.xrevrange(self.keys.dead, end, "-", count=_PAGE)
            for entry_id, fields in rows:
                if fields.get(b"id") == wanted:
                    found.append(self._parse(entry_id, fields))
            if len(rows) < _PAGE:
                return found
            end = "(" + text(rows[-1][0])

    def _check_task_id(self, task_id: str) -> None:
        if not is_task_id(task_id):
            check_reference(task_id)
        queue = queue_of_task_id(task_id)
        if queue != self.queue:
            raise ConfigError(
                f"task {task_id} belongs to queue {queue!r}, not {self.queue!r}: its dead "
                f"letters are in dead_letters({queue!r}) (`tether dead ... --queue {queue}`)"
            )

    async def retry(self, ref: str) -> TaskHandle[Any]:
        """Enqueue the original payload again as a fresh attempt (attempt 1, same task id).
        ``ref`` is an entry id, or a task id (its newest entry is retried)."""
        letter = await self.show(ref)
        call, task_id = self._retry_call(
            letter.entry_id, letter.task_id, letter.payload, letter.stream
        )
        if await call.run(self.app.client) is None:
            raise TaskNotFound(f"dead-letter entry {letter.entry_id} was removed meanwhile")
        return TaskHandle(self.app, task_id, self.queue)

    def _retry_call(
        self, entry_id: str, task_id: str, payload: bytes, stream: str
    ) -> tuple[Call[str | None], str]:
        """The script call that retries a letter (its entry id, task id, payload and the
        stream it came from), and the task id it is queued again under."""
        try:
            env = Envelope.decode(payload, self.app.serializer)
        except BadEnvelope as bad:
            raise TetherError(
                f"dead-letter entry {entry_id} cannot be retried: {bad.reason}"
            ) from None
        env.attempt = 1
        env.id = env.id or task_id  # a plain enqueue's id was derived from its entry
        sidx = self.keys.streams.index(stream) + 1 if stream in self.keys.streams else 2
        call = dead_retry(self.keys, entry_id, sidx, env.id, env.encode(self.app.serializer))
        return call, env.id

    async def purge(self, refs: Sequence[str] | None = None) -> int:
        """Delete the named entries (entry ids, or task ids: all of that task's entries), or
        every entry present now when none are given (:meth:`purge_all`). Returns how many
        were deleted."""
        client = self.app.client
        if refs is None:
            return (await total_of(self.purge_all())).done
        for ref in refs:
            check_reference(ref)
        entry_ids: builtins.list[str] = []
        for ref in refs:
            if is_entry_id(ref):
                entry_ids.append(ref)
            else:
                entry_ids += [letter.entry_id for letter in await self.find(ref)]
        if not entry_ids:
            return 0
        return int(await client.xdel(self.keys.dead, *entry_ids))

    # -- pages and bulk calls: each reads at most SCAN_BUDGET entries --------------------

    async def page(
        self, cursor: str | None = None, limit: int = 50, task: str | None = None
    ) -> Page[DeadLetter]:
        """Newest first, ``limit`` at a time after ``cursor`` (an entry id); with ``task``,
        only that task's letters. A filtered page reads at most SCAN_BUDGET entries, so
        it may hold fewer than ``limit`` while its cursor is not None."""
        found, next_cursor = await self._matching(task, cursor, limit, newest_first=True)
        return Page(found, next_cursor)

    async def retry_many(self, entry_ids: Sequence[str]) -> Bulk:
        """Retry these entries (at most SCAN_BUDGET); those gone or unreadable say why."""
        for entry_id in entry_ids:
            check_entry_id(entry_id)
        if len(entry_ids) > SCAN_BUDGET:
            raise ConfigError(f"at most {SCAN_BUDGET} entries in one call")
        found: builtins.list[_Row] = []
        failed: dict[str, str] = {}
        if entry_ids:
            pipe: Any = self.app.client.pipeline(transaction=False)
            for entry_id in entry_ids:
                pipe.xrange(self.keys.dead, entry_id, entry_id)
            for entry_id, rows in zip(entry_ids, await pipe.execute(), strict=True):
                if rows:
                    found.append(rows[0])
                else:
                    failed[entry_id] = f"no dead-letter entry {entry_id} in queue {self.queue!r}"
        bulk = await self._retry_letters(found)
        bulk.failed.update(failed)
        return bulk

    async def retry_matching(
        self, task: str | None = None, cursor: str | None = None, limit: int = 100
    ) -> Bulk:
        """Retry up to ``limit`` entries of ``task`` (every task when None), oldest first;
        call again with the returned cursor until it is None."""
        rows, next_cursor = await self._matching_rows(task, cursor, limit)
        bulk = await self._retry_letters(rows)
        return Bulk(bulk.done, bulk.failed, bulk.handles, next_cursor)

    async def purge_matching(
        self, task: str | None = None, cursor: str | None = None, limit: int = 500
    ) -> Bulk:
        """Delete up to ``limit`` entries of ``task`` (every task when None), oldest first;
        call again with the returned cursor until it is None."""
        # The ids are all it needs: no letter is parsed (nor its payload decoded, but to
        # filter by task).
        rows, next_cursor = await self._matching_rows(task, cursor, limit)
        ids = [text(entry_id) for entry_id, _ in rows]
        if ids:
            await self.app.client.xdel(self.keys.dead, *ids)
        return Bulk(ids, {}, {}, next_cursor)

    # -- runs: every letter present when the run began, a bulk call at a time -------------

    def retry_all(
        self, task: str | None = None, cursor: str | None = None
    ) -> AsyncGenerator[Bulk, None]:
        """Retry every letter of ``task`` (every task when None) present when the run began,
        oldest first, :meth:`retry_matching` after :meth:`retry_matching`: yields what each
        page of at most SCAN_BUDGET letters did, the last one with no cursor. A letter that
        arrives meanwhile (a retried task that failed again) is left for the next run. Stop
        early and pass a page's cursor back to go on from there; :func:`total_of` sums."""
        return self._every_page(self.retry_matching, task, cursor)

    def purge_all(
        self, task: str | None = None, cursor: str | None = None
    ) -> AsyncGenerator[Bulk, None]:
        """Delete every letter of ``task`` (every task when None) present when the run began,
        by :meth:`purge_matching`, as :meth:`retry_all` retries them."""
        return self._every_page(self.purge_matching, task, cursor)

    # -- blocking twins: for scripts and tests that run no event loop ---------------------
    # Each runs its async reader on a connection of its own (base._blocking.run_blocking).

    def count_sync(self) -> int:
        """:meth:`count`, blocking."""
        return self._blocking("count_sync", lambda letters: letters.count())

    def list_sync(self, count: int = 100, newest_first: bool = True) -> builtins.list[DeadLetter]:
        """:meth:`list`, blocking."""
        return self._blocking("list_sync", lambda letters: letters.list(count, newest_first))

    def show_sync(self, ref: str) -> DeadLetter:
        """:meth:`show`, blocking."""
        return self._blocking("show_sync", lambda letters: letters.show(ref))

    def find_sync(self, task_id: str) -> builtins.list[DeadLetter]:
        """:meth:`find`, blocking."""
        return self._blocking("find_sync", lambda letters: letters.find(task_id))

    def page_sync(
        self, cursor: str | None = None, limit: int = 50, task: str | None = None
    ) -> Page[DeadLetter]:
        """:meth:`page`, blocking."""
        return self._blocking("page_sync", lambda letters: letters.page(cursor, limit, task))

    def retry_sync(self, ref: str) -> TaskHandle[Any]:
        """:meth:`retry`, blocking."""
        handle = self._blocking("retry_sync", lambda letters: letters.retry(ref))
        return TaskHandle(self.app, handle.id, self.queue)  # on the app, not the call's copy

    def purge_sync(self, refs: Sequence[str] | None = None) -> int:
        """:meth:`purge`, blocking."""
        return self._blocking("purge_sync", lambda letters: letters.purge(refs))

    def retry_all_sync(self, task: str | None = None) -> BulkTotal:
        """Every letter of ``task`` (every task when None) retried, as :meth:`retry_all`
        runs them, blocking: the totals."""
        return self._blocking("retry_all_sync", lambda letters: total_of(letters.retry_all(task)))

    def purge_all_sync(self, task: str | None = None) -> BulkTotal:
        """Every letter of ``task`` (every task when None) deleted, as :meth:`purge_all`
        runs them, blocking: the totals."""
        return self._blocking("purge_all_sync", lambda letters: total_of(letters.purge_all(task)))

    def _blocking(self, method: str, work: Callable[[DeadLetters], Awaitable[T]]) -> T:
        return run_blocking(method, self.app, lambda app: work(DeadLetters(app, self.queue)))

    async def _every_page(
        self,
        step: Callable[[str | None, str | None, int], Awaitable[Bulk]],
        task: str | None,
        cursor: str | None,
    ) -> AsyncGenerator[Bulk, None]:
        while True:
            bulk = await step(task, cursor, SCAN_BUDGET)
            yield bulk
            if bulk.cursor is None:
                return
            cursor = bulk.cursor

    async def _retry_letters(self, rows: Sequence[_Row]) -> Bulk:
        """One script call per letter, pipelined (:meth:`_run_calls`). Only the fields a
        retry needs are read, not the whole letter: parsing the fields it never used took
        a quarter of the time of a run over 100,000 letters."""
        failed: dict[str, str] = {}
        calls: builtins.list[tuple[str, Call[str | None], str]] = []
        for raw_id, fields in rows:
            entry_id = text(raw_id)
            letter = _Fields(f"{self.keys.dead} entry {entry_id}", fields)
            try:
                call, task_id = self._retry_call(
                    entry_id,
                    letter.text(b"id"),
                    fields.get(b"m", b""),
                    letter.text(b"queue_stream"),
                )
            except TetherError as exc:
                failed[entry_id] = str(exc)
                continue
            calls.append((entry_id, call, task_id))
        replies = await self._run_calls([call for _, call, _ in calls])
        done: builtins.list[str] = []
        handles: dict[str, str] = {}
        for (entry_id, _, task_id), reply in zip(calls, replies, strict=True):
            if reply is None:
                failed[entry_id] = f"dead-letter entry {entry_id} was removed meanwhile"
            else:
                done.append(entry_id)
                handles[entry_id] = task_id
        return Bulk(done, failed, handles)

    async def _run_calls(self, calls: Sequence[Call[str | None]]) -> builtins.list[str | None]:
        """The first call alone (it loads the script), the rest in one pipeline."""
        if not calls:
            return []
        replies = [await calls[0].run(self.app.client)]
        if len(calls) > 1:
            pipe: Any = self.app.client.pipeline(transaction=False)
            for call in calls[1:]:
                pipe.execute_command(*call.evalsha)
            for call, raw in zip(calls[1:], await pipe.execute(raise_on_error=False), strict=True):
                if isinstance(raw, ResponseError) and "NOSCRIPT" in str(raw):
                    replies.append(await call.run(self.app.client))
                elif isinstance(raw, BaseException):
                    raise raw
                else:
                    replies.append(call.parse(raw))
        return replies

    async def _matching(
        self, task: str | None, cursor: str | None, limit: int, newest_first: bool = False
    ) -> tuple[builtins.list[DeadLetter], str | None]:
        """The letters :meth:`_matching_rows` finds, parsed."""
        rows, next_cursor = await self._matching_rows(task, cursor, limit, newest_first)
        return [self._parse(entry_id, fields) for entry_id, fields in rows], next_cursor

    async def _matching_rows(
        self, task: str | None, cursor: str | None, limit: int, newest_first: bool = False
    ) -> tuple[builtins.list[_Row], str | None]:
        """Up to ``limit`` entries of ``task`` (all when None) after ``cursor``, reading at
        most SCAN_BUDGET entries; the cursor to go on, None at the end.

        Newest first (a page), the cursor is the last entry read. Oldest first (a bulk
        call), it is ``<last read>~<last entry when the first call began>``: letters that
        arrive meanwhile (a retried task that failed again) are not taken up by the same
        run of calls."""
        client = self.app.client
        key = self.keys.dead
        until = "+"
        if newest_first:
            position = None if cursor is None else check_entry_id(cursor)
        elif cursor is None:
            rows: Any = await client.xrevrange(key, "+", "-", count=1)
            if not rows:
                return [], None
            position, until = None, text(rows[0][0])
        else:
            position, until = _bulk_cursor(cursor)
        found: builtins.list[_Row] = []
        read = 0
        chunk = limit
        while len(found) < limit and read < SCAN_BUDGET:
            # A filter reads more as it finds less: a page of a common task costs a page.
            chunk = min(SCAN_BUDGET - read, chunk if not read else chunk * 2)
            if newest_first:
                end = "+" if position is None else "(" + position
                rows = await client.xrevrange(key, end, "-", count=chunk)
            else:
                start = "-" if position is None else "(" + position
                rows = await client.xrange(key, start, until, count=chunk)
            read += len(rows)
            for entry_id, fields in rows:
                position = text(entry_id)
                if task is None or self._task_of(fields) == task:
                    found.append((entry_id, fields))
                    if len(found) == limit:
                        break
            if len(rows) < chunk and len(found) < limit:
                return found, None
        if position is None or (not newest_first and position == until):
            return found, None
        return found, position if newest_first else f"{position}~{until}"

    def _task_of(self, fields: dict[bytes, bytes]) -> str:
        """The task name in a letter's payload ('' when it cannot be read)."""
        try:
            decoded = self.app.serializer.loads(fields.get(b"m", b""))
        except Exception:
            return ""
        if isinstance(decoded, dict) and isinstance(decoded.get("task"), str):
            return str(decoded["task"])
        return ""

    def _parse(self, entry_id: Any, fields: dict[bytes, bytes]) -> DeadLetter:
        """One entry, whatever its fields hold. An entry stays listed even when some of its
        fields cannot be read (it can still be shown and purged): such a field reads as
        empty, or with its bad bytes replaced, and is reported (kind ``dead``)."""
        letter = _Fields(f"{self.keys.dead} entry {text(entry_id)}", fields)
        return DeadLetter(
            entry_id=text(entry_id),
            task_id=letter.text(b"id"),
            task=self._task_of(fields),
            status=letter.text(b"status") or "dead",
            reason=letter.text(b"reason"),
            error=letter.error(self.app.serializer.loads),
            payload=fields.get(b"m", b""),
            at=letter.time(b"at"),
            deliveries=letter.count(b"deliveries"),
            stream=letter.text(b"queue_stream"),
        )


_ERROR_TEXTS = ("type", "message", "traceback")
"""The fields of a letter's error the pages and the CLI print as text."""


@dataclass(frozen=True)
class _Fields:
    """The fields of one dead-letter entry, each read as Tether writes it or reported."""

    where: str
    fields: dict[bytes, bytes]

    def text(self, name: bytes) -> str:
        """A text field; its bad bytes replaced (and reported) when it is not UTF-8."""
        raw = self.fields.get(name, b"")
        found = parsed("dead", f"{self.where} field {name.decode()}", raw.decode)
        return found if found is not None else raw.decode(errors="replace")

    def count(self, name: bytes) -> int:
        """A whole number; 0 (reported) for anything else."""
        raw = self.fields.get(name)
        if raw is None:
            return 0
        found = parsed("dead", f"{self.where} field {name.decode()}", lambda: _whole(raw))
        return found or 0

    def time(self, name: bytes) -> datetime | None:
        """Unix milliseconds as a time; None (reported) for one no datetime holds."""
        raw = self.fields.get(name)
        if not raw:
            return None
        return parsed(
            "dead",
            f"{self.where} field {name.decode()}",
            lambda: datetime.fromtimestamp(_whole(raw) / 1000, tz=timezone.utc),
        )

    def error(self, loads: Any) -> dict[str, Any]:
        """The error of the last attempt: an object whose type, message and traceback are
        text. Anything else is reported and shown as the message (what a person can read
        of it), so the pages and the CLI print it without a special case."""
        raw = self.fields.get(b"error")
        if not raw:
            return {}
        where = f"{self.where} field error"
        loaded = parsed("dead", where, lambda: loads(raw))
        if loaded is None:
            return {"message": raw.decode(errors="replace")}
        if not isinstance(loaded, dict):
            skip("dead", where, f"a {type(loaded).__name__}, not an object")
            return {"message": str(loaded)[:10_000]}
        error = {str(k): v for k, v in loaded.items()}
        for key in _ERROR_TEXTS:
            if key in error and not isinstance(error[key], str):
                skip("dead", f"{where} {key}", f"{error[key]!r:.100} is not text")
                error[key] = repr(error[key])[:10_000]
        return error


def _whole(raw: bytes) -> int:
    """ASCII digits (a sign allowed) as an int; ValueError for anything else."""
    if not raw.isascii() or len(raw) > 20:
        raise ValueError(f"{raw[:40]!r} is not a whole number Tether writes")
    return int(raw)
