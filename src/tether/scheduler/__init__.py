"""Periodic tasks across replicas: cron and interval schedules, one leader, one enqueue per tick."""

from ..base._schedule import Schedule, ScheduleBackoff
from ._control import BackoffState, ScheduleInfo, Schedules, TickRecord, TriggeredRun
from ._scheduler import Scheduler

__all__ = [
    "BackoffState",
    "Schedule",
    "ScheduleBackoff",
    "ScheduleInfo",
    "Scheduler",
    "Schedules",
    "TickRecord",
    "TriggeredRun",
]
