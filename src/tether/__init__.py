"""Tether: a Python task queue on Redis Streams that loses no task and robs no live worker.

from tether import Tether

app = Tether("redis://localhost:6379/0")

@app.task
async def add(x: int, y: int) -> int:
    return x + y
"""

from ._app import Tether
from .base._config import Backoff
from .base._context import TaskContext, current_task
from .base._errors import (
    ArgumentSerializationError,
    BlockingCallError,
    ConfigError,
    EnqueueError,
    InvalidArguments,
    NotOpen,
    QueueNotFound,
    RateLimited,
    ResultSerializationError,
    ResultTimeout,
    Retry,
    SerializationError,
    ServerError,
    TaskFailed,
    TaskNotFound,
    TaskTimeout,
    TetherError,
)
from .base._middleware import Middleware
from .base._schedule import ScheduleBackoff
from .base._settings import PRIORITIES, WorkerSettings
from .base._status import CancelResult, TaskStatus
from .base._version import __version__
from .producer._handle import TaskHandle
from .producer._task import AsyncTask, SyncTask, Task, TaskCall
from .protocol._envelope import JsonSerializer, Serializer
from .worker import Worker, WorkerCounters

__all__ = [
    "ArgumentSerializationError",
    "AsyncTask",
    "Backoff",
    "BlockingCallError",
    "CancelResult",
    "ConfigError",
    "EnqueueError",
    "InvalidArguments",
    "JsonSerializer",
    "Middleware",
    "NotOpen",
    "PRIORITIES",
    "QueueNotFound",
    "RateLimited",
    "ResultSerializationError",
    "ResultTimeout",
    "Retry",
    "ScheduleBackoff",
    "SerializationError",
    "Serializer",
    "ServerError",
    "SyncTask",
    "Task",
    "TaskCall",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "TaskNotFound",
    "TaskStatus",
    "TaskTimeout",
    "Tether",
    "TetherError",
    "Worker",
    "WorkerCounters",
    "WorkerSettings",
    "__version__",
    "current_task",
]
