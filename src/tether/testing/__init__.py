"""Testing Tether code: without a server (recording and eager modes), and against a real one
(an isolated app, and ``drain()``), with a pytest plugin that provides them as fixtures.

    from tether.testing import eager, recording

    with recording(app) as queue:           # nothing runs; assert what was enqueued
        signup("ann@example.com")
        queue.assert_enqueued_once(send_welcome.options(queue="emails"), "ann@example.com")

    with eager(app):                        # tasks run at enqueue, in this process
        assert add.enqueue_sync(1, 2).result_sync() == 3

The pytest plugin (loaded by the ``pytest11`` entry point) adds the fixtures
``tether_server``, ``tether_app``, ``tether_drain``, ``tether_eager`` and
``tether_recording``; see docs/testing.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._eager import Eager, TaskError
from ._memory import Enqueued, Recorder
from ._server import DRAIN_SETTINGS, DrainTimeout, delete_namespace, drain, drain_sync, isolated

if TYPE_CHECKING:
    from ..producer._core import Core


def recording(app: Core) -> Recorder:
    """Record the app's enqueues in memory; nothing runs and no server is needed. Use as a
    context manager (``with recording(app) as queue``)."""
    return Recorder(app)


def eager(app: Core, *, inline: bool = True, propagate: bool = False) -> Eager:
    """Run the app's tasks in this process: at enqueue (``inline=True``) or at
    ``queue.drain()``; ``propagate=True`` raises a task's failure where it ran. Everything
    is recorded as in :func:`recording`. Use as a context manager."""
    return Eager(app, inline=inline, propagate=propagate)


__all__ = [
    "DRAIN_SETTINGS",
    "DrainTimeout",
    "Eager",
    "Enqueued",
    "Recorder",
    "TaskError",
    "delete_namespace",
    "drain",
    "drain_sync",
    "eager",
    "isolated",
    "recording",
]
