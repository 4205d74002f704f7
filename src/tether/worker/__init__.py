"""The worker: fetch, run, fenced ack, with leases and reclaim (see DESIGN.md)."""

from ._state import WorkerCounters
from ._worker import Worker

__all__ = ["Worker", "WorkerCounters"]
