"""The delivery engine's public kit, for consumers other than :class:`~tether.Worker`.

The taskiq broker (and any other runtime that runs tasks its own way) builds on these
instead of the worker's private modules: the :class:`Engine` fetches, leases, settles and
hands off; an :class:`Executor` runs what it delivers and reports each attempt's
:class:`Outcome`, decided by the attempt policy's functions (``success``, ``retry``,
``failure``, ``dead``, ``cancelled``, ``decide``, ``error_fields``).
"""

from ._engine import Engine, Executor, Options, Parts, check_settings
from ._ledger import Ledger
from ._outcome import (
    Decision,
    Outcome,
    Target,
    cancelled,
    dead,
    decide,
    error_fields,
    failure,
    retry,
    success,
)
from ._state import Delivery, QueueState, WorkerCounters

__all__ = [
    "Decision",
    "Delivery",
    "Engine",
    "Executor",
    "Ledger",
    "Options",
    "Outcome",
    "Parts",
    "QueueState",
    "Target",
    "WorkerCounters",
    "cancelled",
    "check_settings",
    "dead",
    "decide",
    "error_fields",
    "failure",
    "retry",
    "success",
]
