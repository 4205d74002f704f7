"""What an enqueue that failed on the server or the network tells its caller: the cause, and
whether the task may have been written.

Three answers: a reply (``BUSY``, ``OOM``, a missing permission) is a refusal, so nothing
was written; a connection that failed before the command went out (refused, unknown host,
the connect timed out, no free connection in the pool) sent nothing; a connection lost after
the command went out leaves it unknown, since the server may have written the task before
the reply was lost.

Telling the last two apart takes more than the final error. redis-py sends a command again
after a lost connection (the clients retry 3 times), so "connection refused" may be the
answer to a retry whose first attempt reached the server (a server that died mid-reply and
did not come back): the error alone cannot say. Where the error was raised can: the
standalone and Sentinel clients open (or check) the connection in the pool's
``get_connection``, before and outside the loop that sends and re-sends the command, so an
error raised there was raised before anything was sent. A Cluster client re-enters
``get_connection`` on each of its own retries, so there the answer stays unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis.exceptions

from ..base._errors import EnqueueError
from ..base._faults import Fault, classify, describe_error, is_pool_exhausted

if TYPE_CHECKING:
    from ._core import Core

MAYBE_WRITTEN = "it may or may not have been enqueued (give a dedup key to retry safely)"
NOT_SENT = "no connection was made, so nothing was enqueued"
NOT_WRITTEN = "nothing was enqueued"

_OPENING = "get_connection"
"""The pool method that opens or checks a connection before a command is sent (in redis-py's
pools and in ``tether.base._redis``'s)."""


def enqueue_error(core: Core, task: str, exc: BaseException) -> EnqueueError:
    """A clear EnqueueError naming the cause, for any error of the server or the network."""
    cause = describe_error(exc, core.target.redacted)
    error = EnqueueError(f"task {task!r} could not be enqueued: {cause}; {outcome(core, exc)}")
    error.cause = exc
    return error


def outcome(core: Core, exc: BaseException) -> str:
    """Whether the failed command may have written the task, in words."""
    if isinstance(exc, redis.exceptions.ResponseError) or is_pool_exhausted(exc):
        return NOT_WRITTEN  # a reply is a refusal; a pool with no free connection sent nothing
    if classify(exc, core.target.redacted) is not Fault.TRANSIENT:
        return NOT_WRITTEN  # a wrong password, a refused certificate: no command got through
    if core.target.kind != "cluster" and raised_while_connecting(exc):
        return NOT_SENT
    return MAYBE_WRITTEN


def raised_while_connecting(exc: BaseException) -> bool:
    """Whether ``exc`` came out of the pool's ``get_connection``: the connection for the
    command could not be opened (or a pooled one could not be renewed), so the command was
    never sent. Its traceback runs from the caller's frame down to where it was raised."""
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_name == _OPENING:
            return True
        frame = frame.tb_next
    return False
