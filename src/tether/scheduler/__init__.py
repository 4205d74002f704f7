"""Periodic tasks across replicas: cron and interval schedules, one leader, one enqueue per tick."""

from ..base._schedule import Schedule
from ._control import ScheduleInfo, Schedules
from ._scheduler import Scheduler

__all__ = ["Schedule", "ScheduleInfo", "Scheduler", "Schedules"]
