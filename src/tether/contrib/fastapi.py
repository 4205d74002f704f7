"""FastAPI (and any Starlette app): open the Tether app in the lifespan, give endpoints the
app through a dependency, and optionally run a worker in the same process.

    from typing import Annotated
    from fastapi import Depends, FastAPI
    from tether.contrib.fastapi import TetherApp, lifespan

    api = FastAPI(lifespan=lifespan(app))            # lifespan(app, worker=True) for one process

    @api.get("/tasks/{task_id}")
    async def task_status(task_id: str, tether: TetherApp) -> dict[str, str]:
        return {"status": (await tether.handle(task_id).status()).value}

The in-process worker suits small deployments (one container serving the API and running
its tasks); it shares the event loop with the endpoints, so plain-function tasks run in its
thread pool and CPU-heavy async tasks slow the API down. Run ``tether worker`` beside the
API once the load grows. It never installs signal handlers: the server (uvicorn) owns the
process, and the worker stops gracefully when the lifespan ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request

from tether import ConfigError, Tether, Worker, WorkerSettings

__all__ = ["TetherApp", "get_tether", "lifespan", "running_worker"]

log = logging.getLogger("tether.contrib.fastapi")

STATE_KEY = "tether"
"""The lifespan state key under which endpoints find the app (``request.state.tether``)."""

READY_TIMEOUT = 30.0
"""How long the lifespan waits for the in-process worker to take its lease."""


@contextlib.asynccontextmanager
async def running_worker(
    app: Tether, settings: WorkerSettings | None = None, **overrides: Any
) -> AsyncIterator[Worker]:
    """A worker on the running event loop for the duration of the block, stopped gracefully
    at its end (running tasks get ``shutdown_grace``). It runs on ``settings`` (by default
    ``WorkerSettings()``) with ``overrides``, fields of :class:`~tether.WorkerSettings`,
    applied. A worker that cannot start raises here, so the server fails at start-up instead
    of serving without one."""
    if settings is None:
        settings = WorkerSettings(**overrides)
    elif overrides:
        settings = dataclasses.replace(settings, **overrides)
    worker = Worker(app, settings, handle_signals=False)
    task = asyncio.create_task(worker.run(), name="tether-worker")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT
    while not worker.ready.is_set():
        if task.done():
            task.result()  # raises the worker's error (a refused password, a bad setting)
            raise ConfigError("the in-process worker stopped before it started serving")
        if loop.time() > deadline:
            worker.abort()
            await asyncio.gather(task, return_exceptions=True)
            raise ConfigError(f"the in-process worker did not start within {READY_TIMEOUT}s")
        await asyncio.sleep(0.01)
    try:
        yield worker
    finally:
        worker.stop()
        await task


def lifespan(
    app: Tether,
    *,
    worker: bool | WorkerSettings | Mapping[str, Any] = False,
    then: Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None = None,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan for ``FastAPI(lifespan=...)``: ``async with app`` while the server runs,
    the app in the lifespan state for :func:`get_tether`, and with ``worker=True`` (or a
    :class:`~tether.WorkerSettings`, or a dict of its fields) a worker in the same process.

    ``then`` is the application's own lifespan, entered inside Tether's, so its start-up
    code may enqueue; a dict it yields is merged into the state."""

    @contextlib.asynccontextmanager
    async def run(api: Any) -> AsyncIterator[dict[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(app)
            if isinstance(worker, WorkerSettings):
                await stack.enter_async_context(running_worker(app, worker))
            elif worker:
                overrides = dict(worker) if isinstance(worker, Mapping) else {}
                await stack.enter_async_context(running_worker(app, **overrides))
            state: dict[str, Any] = {STATE_KEY: app}
            if then is not None:
                extra = await stack.enter_async_context(then(api))
                if isinstance(extra, Mapping):
                    state.update(extra)
            yield state

    return run


def get_tether(request: Request) -> Tether:
    """The dependency: the Tether app opened by :func:`lifespan`."""
    app = getattr(request.state, STATE_KEY, None)
    if not isinstance(app, Tether):
        raise ConfigError(
            "no Tether app in the request state: create the API with "
            "FastAPI(lifespan=tether.contrib.fastapi.lifespan(app))"
        )
    return app


TetherApp = Annotated[Tether, Depends(get_tether)]
"""An endpoint parameter typed ``TetherApp`` receives the app (``tether: TetherApp``)."""
