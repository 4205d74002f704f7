"""Tether: a Python task queue on Redis Streams that loses no task and robs no live worker.

from tether import Tether

app = Tether("redis://localhost:6379/0")

@app.task
async def add(x: int, y: int) -> int:
    return x + y
"""

from ._app import Tether
from ._config import Backoff
from ._context import TaskContext, current_task
from ._envelope import JsonSerializer, Serializer
from ._errors import (
    ArgumentSerializationError,
    BlockingCallError,
    ConfigError,
    EnqueueError,
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
from ._handle import TaskHandle
from ._middleware import Middleware
from ._settings import PRIORITIES, WorkerSettings
from ._status import CancelResult, TaskStatus
from ._task import AsyncTask, SyncTask, Task, TaskCall
from ._version import __version__
from .worker import Worker, WorkerCounters

__all__ = [
    "ArgumentSerializationError",
    "AsyncTask",
    "Backoff",
    "BlockingCallError",
    "CancelResult",
    "ConfigError",
    "EnqueueError",
    "JsonSerializer",
    "Middleware",
    "NotOpen",
    "PRIORITIES",
    "QueueNotFound",
    "RateLimited",
    "ResultSerializationError",
    "ResultTimeout",
    "Retry",
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
