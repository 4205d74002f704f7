"""The producer's kit: enqueue as a pure step and thin executors.

An enqueue call is planned and encoded without I/O (:func:`write_of`, or for a runtime
that encodes its own payloads, :func:`plain_steps` and :func:`scripted_steps`), then sent
by :func:`execute` (asyncio) or :func:`execute_sync` (blocking): the same commands, the
same scripts, the same bytes from either. The taskiq broker sends through it too.
"""

from ._enqueue import (
    CHUNK,
    DEDUP_MAX_HOLD_MS,
    CallOptions,
    Plan,
    Step,
    Write,
    encode,
    execute,
    execute_sync,
    handles_of,
    plain_steps,
    scripted_steps,
    write_of,
)
from ._failure import enqueue_error

__all__ = [
    "CHUNK",
    "DEDUP_MAX_HOLD_MS",
    "CallOptions",
    "Plan",
    "Step",
    "Write",
    "encode",
    "enqueue_error",
    "execute",
    "execute_sync",
    "handles_of",
    "plain_steps",
    "scripted_steps",
    "write_of",
]
