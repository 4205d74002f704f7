"""The delivery engine's public kit, for consumers other than :class:`~tether.Worker`.

The taskiq broker (and any other runtime that runs tasks its own way) builds on these
instead of the worker's private modules: the :class:`Engine` fetches, leases, settles and
hands off; an :class:`Executor` runs what it delivers and reports each attempt's
:class:`Outcome`, decided by the attempt policy: what may run (``runnable``), how one
attempt runs (``run_attempt``: hooks, ``current_task()``, run scopes, timeout), what a
failure becomes (``judge``, ``failure_reason``) and the settle instruction for each end
(``success``, ``retry``, ``failure``, ``dead``, ``cancelled``).
"""

from ._attempt import (
    Failure,
    Ran,
    Scopes,
    after_failure,
    after_retry,
    after_success,
    check_result,
    failure_reason,
    judge,
    run_attempt,
    runnable,
)
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
from ._waiting import Waiting, quarantine_reason

__all__ = [
    "Failure",
    "Ran",
    "Scopes",
    "after_failure",
    "after_retry",
    "after_success",
    "check_result",
    "failure_reason",
    "judge",
    "quarantine_reason",
    "run_attempt",
    "runnable",
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
    "Waiting",
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
