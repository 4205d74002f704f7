"""One classification of what a Redis server (or the way to it) can answer instead of a
result, used by every loop that talks to Redis: the worker's fetch, settle, lease,
maintenance and flow control, the scheduler, the taskiq consumer, and the producers' retries.

    TRANSIENT   the server will answer again: a lost connection, a timeout, and the states a
                healthy deployment passes through (CLUSTERDOWN and MASTERDOWN during a
                failover, TRYAGAIN during a slot migration, LOADING after a restart, BUSY
                while another client's script runs too long, MISCONF after a failed RDB
                save, OOM at maxmemory, READONLY from a demoted master, NOREPLICAS):
                retry with backoff, log the state once.
    FATAL       no retry can fix it: a wrong password, a missing permission, a refused TLS
                certificate or missing TLS file, a command the server does not know.
                Stop with one line naming it.
    LOST        the stream or its consumer group is gone (a server restarted empty, a
                flush): the entries held there no longer exist.
    UNKNOWN     any other reply: logged with the reply and retried with backoff, unless it
                repeats past a bound (:class:`UnknownReplies`); then it is treated as fatal.
    INTERNAL    not an error of the server or the network (a bug): not caught here.

Why one function rather than ``except`` clauses: redis-py raises ``BUSY`` and ``MISCONF``
as a plain ``ResponseError``, and ``CLUSTERDOWN``, ``TRYAGAIN`` and ``READONLY`` as
subclasses of it, so a handler that catches ``ResponseError`` before the transient classes
took a failover for a bug and stopped the worker.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import ssl
from urllib.parse import parse_qs, urlsplit

import redis.exceptions

log = logging.getLogger("tether")


class Fault(enum.Enum):
    TRANSIENT = "transient"
    FATAL = "fatal"
    LOST = "lost"
    UNKNOWN = "unknown"
    INTERNAL = "internal"


TRANSIENT_CODES = frozenset(
    {
        "CLUSTERDOWN",  # a master failed and no replica took over yet
        "MASTERDOWN",  # a replica lost its master (replica-serve-stale-data no)
        "TRYAGAIN",  # a multi-key command during a slot migration
        "LOADING",  # the server is loading its data set after a restart
        "BUSY",  # another client's script or function runs past busy-reply-threshold
        "MISCONF",  # the last RDB save failed and stop-writes-on-bgsave-error is set
        "OOM",  # maxmemory reached under noeviction
        "READONLY",  # a demoted master, until the client follows the promotion
        "NOREPLICAS",  # fewer replicas than min-replicas-to-write
    }
)
"""Error codes of server states that pass: the first word of the reply."""

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # includes BusyLoadingError (a server loading its data)
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,  # includes ClusterDownError and MasterDownError (failover)
    redis.exceptions.TryAgainError,  # a slot being migrated
    redis.exceptions.ReadOnlyError,  # a demoted master, until the client follows the promotion
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.SlotNotCoveredError,  # a Cluster whose failed master has no successor yet
    redis.exceptions.RedisClusterUnreachableError,  # no startup node answers (a restart)
    ConnectionError,
    OSError,
)
"""The transient errors redis-py has classes for. ``BUSY`` and ``MISCONF`` have none:
only :func:`classify` recognises them (from the reply's code)."""

FATAL_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
"""Errors no retry can fix: a wrong password, a user without the needed permissions."""

_REFUSED_IN_SCRIPT = (
    "The user executing the script can't",  # Redis 7.0, which does not name the command
    "ACL failure in script",  # Valkey and newer Redis: "... to run the 'x' command ..."
    "NOPERM",
)
_COMMAND_NAMED = re.compile(r"run the '([^']+)' command")
_UNKNOWN_COMMAND = ("unknown command", "ERR unknown command")
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def reply_code(exc: BaseException) -> str:
    """The error code a server reply starts with (``BUSY``, ``MISCONF``, ``ERR``), or ""
    for an error that is not a server reply. redis-py strips the code from the message of
    the errors it has classes for, and keeps it as ``status_code`` from version 8 on."""
    if not isinstance(exc, redis.exceptions.ResponseError):
        return ""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    first = str(exc).split(" ", 1)[0]
    return first if first.isupper() and first.isalpha() else ""


def is_missing_group(exc: BaseException) -> bool:
    """The stream or its consumer group is gone: the server restarted without its data, or
    someone deleted the stream (a read blocked on it then fails with UNBLOCKED). The entries
    a worker held there no longer exist."""
    message = str(exc)
    return isinstance(exc, redis.exceptions.ResponseError) and (
        "NOGROUP" in message or message.startswith("UNBLOCKED the stream key no longer exists")
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """The server refused a write because it reached ``maxmemory`` (policy noeviction)."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
        isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("OOM")
    )


def is_permission_error(exc: BaseException) -> bool:
    """The user may not run a command or reach a key: refused by the server directly
    (``NOPERM``), or inside a Lua script, whose error the server words differently."""
    if isinstance(exc, redis.exceptions.NoPermissionError | redis.exceptions.AuthorizationError):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(
        _REFUSED_IN_SCRIPT
    )


def refused_command(message: str) -> str | None:
    """The command a permission error names (``... to run the 'hscan' command``), if any."""
    found = _COMMAND_NAMED.search(message)
    return found.group(1).lower() if found else None


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from or during (redis-py wraps socket and TLS
    errors in a ConnectionError whose context is the real cause)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_tls(where: str) -> bool:
    return where.partition("://")[0].lower().startswith(("rediss", "valkeys"))


def is_fatal(exc: BaseException, where: str) -> bool:
    """No retry can fix ``exc`` at the server ``where`` (a URL): a wrong password, a missing
    permission, a TLS certificate the client refuses, a TLS file named in the URL that does
    not exist, a command the server does not know."""
    if is_permission_error(exc):
        return True
    if isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(_UNKNOWN_COMMAND):
        return True
    for cause in _causes(exc):
        if isinstance(cause, (*FATAL_ERRORS, ssl.SSLCertVerificationError)):
            return True
        if isinstance(cause, FileNotFoundError) and _is_tls(where):
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """The server (or the way to it) will answer again: retry with backoff."""
    return isinstance(exc, TRANSIENT_ERRORS) or reply_code(exc) in TRANSIENT_CODES


def classify(exc: BaseException, where: str = "") -> Fault:
    """What ``exc``, raised by a call to the server at ``where`` (a URL, for the TLS
    checks), means for the loop that made the call (see the module's table)."""
    if is_fatal(exc, where):
        return Fault.FATAL
    if is_missing_group(exc):
        return Fault.LOST
    if is_transient(exc):
        return Fault.TRANSIENT
    if isinstance(exc, redis.exceptions.RedisError | redis.exceptions.RedisClusterException):
        return Fault.UNKNOWN
    return Fault.INTERNAL


UNKNOWN_REPLY_LIMIT = 10
"""How many unknown replies in a row a loop retries before it treats them as fatal."""


class UnknownReplies:
    """Counts one loop's unknown replies in a row. A reply Tether does not know may be a
    passing state it has not met yet, so it is retried with backoff; the same failure on
    every call is not passing, and retrying it forever would hide it, so past ``limit`` in
    a row the loop stops with the reply."""

    def __init__(self, limit: int = UNKNOWN_REPLY_LIMIT) -> None:
        self.limit = limit
        self.count = 0

    def failed(self, exc: BaseException, what: str) -> bool:
        """Count ``exc``; True when the bound is passed. Logs the first with its reply."""
        self.count += 1
        if self.count == 1:
            log.warning(
                "%s: unexpected reply from Redis (%s: %s); retrying with backoff, and "
                "stopping if it repeats %d times in a row",
                what, type(exc).__name__, exc, self.limit,
            )  # fmt: skip
        return self.count >= self.limit

    def succeeded(self) -> None:
        self.count = 0


def _missing_tls_files(where: str) -> list[str]:
    query = {k: v[-1] for k, v in parse_qs(urlsplit(where).query).items()}
    return [f"{k}={query[k]}" for k in _TLS_FILES if k in query and not os.path.exists(query[k])]


def describe_error(exc: BaseException, where: str, command: str | None = None) -> str:
    """One line for a person: what went wrong with the server at ``where``. For a missing
    permission, ``command`` names the command refused when the error does not (Redis 7.0
    inside a script: the caller can tell it from the script's line)."""
    message = str(exc).strip() or type(exc).__name__
    if is_out_of_memory(exc):
        return (
            f"the server at {where} is out of memory (maxmemory reached with the noeviction "
            "policy): free memory or raise maxmemory"
        )
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"authentication failed at {where}: wrong user name or password ({message})"
    if is_permission_error(exc):
        command = refused_command(message) or command
        allow = f"; allow it with +{command} in the user's ACL rule" if command else ""
        return f"the user lacks a permission at {where}: {message.rstrip('.')}{allow}"
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = getattr(cause, "verify_message", None) or cause  # set by the ssl module
            return (
                f"the TLS certificate of the server at {where} was refused ({why}): name the "
                "authority that signed it with ssl_ca_certs=/path/to/ca.pem in the URL"
            )
        if isinstance(cause, FileNotFoundError) and _is_tls(where):
            missing = ", ".join(_missing_tls_files(where)) or "a TLS file of the URL"
            return f"cannot connect to {where}: no such file: {missing}"
    return _describe_passing(exc, where, message)


def is_pool_exhausted(exc: BaseException) -> bool:
    """Every connection of the client's pool stayed in use for the whole wait: no command
    was sent (the server may be perfectly well)."""
    return isinstance(exc, redis.exceptions.MaxConnectionsError) or (
        # a waiting pool whose wait ran out: redis-py's blocking pool (the blocking clients)
        # and tether.base._redis's asyncio one raise the same error
        isinstance(exc, redis.exceptions.ConnectionError)
        and str(exc).startswith("No connection available")
    )


def _describe_passing(exc: BaseException, where: str, message: str) -> str:
    """The line for the states that pass (and for any other reply)."""
    code = reply_code(exc)
    if is_pool_exhausted(exc):
        return (
            f"every connection to {where} of this process is in use and none came free in "
            "time: raise max_connections or pool_timeout, or make fewer concurrent calls"
        )
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return f"the server at {where} is a read-only replica (a failover in progress?)"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return f"the server at {where} is loading its data"
    if isinstance(exc, redis.exceptions.ClusterDownError | redis.exceptions.SlotNotCoveredError):
        return f"the cluster at {where} is down (a failover in progress?): {message}"
    if isinstance(exc, redis.exceptions.TryAgainError):
        return f"the cluster at {where} is migrating a slot: {message}"
    if code in _STATES:
        return f"the server at {where} {_STATES[code]}: {message}"
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"the server at {where} did not answer in time ({message})"
    if isinstance(exc, redis.exceptions.ConnectionError | OSError):
        return f"cannot reach the server at {where} ({message})"
    return f"the server at {where} answered: {message}"


_STATES = {
    "BUSY": "is busy running another client's script",
    "MISCONF": "refuses writes after a failed save",
    "NOREPLICAS": "has fewer replicas than min-replicas-to-write",
}
