"""Every exception Tether raises on purpose.

    TetherError
    ├── ConfigError                     a setting or URL is invalid (raised at start-up)
    ├── ServerError                     the Redis server cannot be used (too old, wrong mode)
    ├── EnqueueError                    a task could not be enqueued (the message says whether
    │   │                               anything may have been written)
    │   └── InvalidArguments            the call's arguments are wrong: nothing was written, and
    │       │                           the same call fails again (a TypeError too)
    │       └── ArgumentSerializationError  an argument cannot be encoded by the serializer
    ├── SerializationError              a value cannot go through the serializer (either kind)
    │   ├── ArgumentSerializationError  (the same class: invalid arguments too)
    │   └── ResultSerializationError    a task's result cannot be encoded
    ├── TaskNotFound                    no task with that id is known (never existed or expired)
    ├── QueueNotFound                   no queue of that name is known (nothing names it)
    ├── TaskFailed                      the task ended without a value (remote type, message)
    ├── TaskTimeout                     a task ran past its timeout (``tether.TaskTimeout``)
    ├── ResultTimeout                   waiting for a result took longer than asked
    ├── NotOpen                         the app has no open connection (use ``async with app``)
    └── BlockingCallError               a blocking ``*_sync`` call on an event loop's thread

Errors defined next to the code that raises them derive from ``TetherError`` directly:
``BadEnvelope`` (an entry that cannot be run), and taskiq's ``DeliveryLost`` (a message another
worker took over) and ``NotTaskiq`` (an entry that carries no taskiq message).

``Retry`` and ``RateLimited`` are not errors: a task raises them to ask for another attempt
(``RateLimited`` without counting one).
"""

from __future__ import annotations

from datetime import timedelta


class TetherError(Exception):
    """Base class of every exception Tether raises on purpose."""


class ConfigError(TetherError, ValueError):
    """A setting, URL or declaration is invalid. The message names the setting."""


class ServerError(TetherError):
    """The Redis server cannot be used, for example because it is older than 6.2."""


class EnqueueError(TetherError):
    """A task could not be enqueued; the message names the cause and says whether anything
    may have been written (a connection lost mid-command leaves that unknown).

    Its subclass :class:`InvalidArguments` is a call that cannot succeed as it is; any other
    ``EnqueueError`` is the server (or the way to it) failing the call, which may succeed
    later: a web view answers the first with a 422 and the rest with a 503."""

    cause: BaseException | None = None
    """The underlying error of the server or the network, if any."""


class InvalidArguments(EnqueueError, TypeError):
    """The arguments of an enqueue are wrong: they do not fit the task's signature (a
    missing or unexpected argument), or the serializer cannot encode one of them
    (:class:`ArgumentSerializationError`). Nothing was written, and the same call fails
    again whatever the server's state. A :class:`TypeError`, as a wrong call of the
    function itself is, and an :class:`EnqueueError`, as it always was."""


class SerializationError(TetherError, TypeError):
    """A value cannot go through the app's serializer. Catch this to handle both kinds:
    :class:`ArgumentSerializationError` (an enqueue's arguments) and
    :class:`ResultSerializationError` (a task's result)."""


class ArgumentSerializationError(SerializationError, InvalidArguments):
    """An argument cannot be encoded, so the task was not enqueued. The message names the
    task and the argument. :class:`InvalidArguments` (and so an :class:`EnqueueError`) too:
    nothing was written."""


class ResultSerializationError(SerializationError):
    """A task's result cannot be encoded by the serializer: the attempt fails with this
    error (recorded in its result and dead letter), as with ``tether.testing``'s eager mode.
    A stored record that cannot be decoded when read raises :class:`TaskNotFound` instead."""

    __module__ = "tether"  # recorded by its public name, as TaskTimeout below


class TaskNotFound(TetherError, LookupError):
    """No task with this id is known: it never existed, or its record expired."""


class QueueNotFound(TetherError, LookupError):
    """No queue of this name is known: no worker serves it, no task of the app names it,
    and it has no keys."""


class TaskTimeout(TetherError, TimeoutError):
    """A task ran past its timeout; the attempt fails with this error and is retried per the
    task's policy."""

    # Results, dead letters, statistics and traces record an error by its class's module and
    # name: this one is recorded as ``tether.TaskTimeout``, its public and stable name, and
    # not by the private module that happens to define it.
    __module__ = "tether"

    slot_kept = False
    """True when a sync task's thread still runs and keeps its slot until it returns."""


class ResultTimeout(TetherError, TimeoutError):
    """The task did not finish within the time the caller was willing to wait."""


class NotOpen(TetherError, RuntimeError):
    """The app has no open connection. Use ``async with app:`` or ``await app.open()``."""


class BlockingCallError(TetherError, RuntimeError):
    """A blocking call (``enqueue_sync``, ``result_sync``, ...) was made on a thread that runs
    an event loop, which it would freeze. Use the ``async`` method there."""


class TaskFailed(TetherError):
    """The task ended without a value.

    ``status`` is the final status (``failed``, ``dead`` or ``cancelled``); ``error_type``,
    ``error_message`` and ``traceback`` describe the exception raised in the worker.
    """

    def __init__(
        self,
        task_id: str,
        status: str,
        error_type: str,
        error_message: str,
        traceback: str = "",
    ) -> None:
        self.task_id = task_id
        self.status = status
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        super().__init__(f"task {task_id} {status}: {error_type}: {error_message}")


class Retry(Exception):
    """Raise inside a task to ask for another attempt after ``delay`` seconds.

    Counts against the task's ``retries``; when they are used up the task fails as if it
    had raised the exception that caused the retry.
    """

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and delay < 0:
            raise ConfigError(f"Retry(delay={delay!r}): the delay must be zero or more seconds")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay})")


class RateLimited(Exception):
    """Raise inside a task when a service it calls says "too many requests" (an HTTP 429):
    the task runs again after ``retry_after`` seconds, and this attempt does not count
    against its retries.

    ``retry_after`` defaults to the task's backoff for a first retry.
    """

    def __init__(self, retry_after: float | timedelta | None = None, reason: str = "") -> None:
        if isinstance(retry_after, timedelta):
            retry_after = retry_after.total_seconds()
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, (int, float))
            or retry_after < 0
        ):
            raise ConfigError(
                f"RateLimited(retry_after={retry_after!r}): expected zero or more seconds"
            )
        self.retry_after = None if retry_after is None else float(retry_after)
        self.reason = reason
        super().__init__(reason or f"rate limited (retry after {retry_after}s)")


# Every public error is recorded (results, dead letters, traces, statistics) by its public
# name, ``tether.EnqueueError``, not by the module that happens to define it: a name read
# back months later must not change when the code moves.
for _public in (
    TetherError, ConfigError, ServerError, EnqueueError, InvalidArguments, SerializationError,
    ArgumentSerializationError, TaskNotFound, QueueNotFound, ResultTimeout, NotOpen,
    BlockingCallError, TaskFailed, Retry, RateLimited,
):  # fmt: skip
    _public.__module__ = "tether"
del _public
