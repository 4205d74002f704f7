"""The FastAPI recipe of docs/producers.md as a module the tests serve with uvicorn: ``api``
enqueues for a separate ``tether worker``; ``api_with_worker`` runs its worker in-process.
Its views ``enqueue_add`` and ``task_status`` and its task ``add`` are the recipe's, word for
word (``test_the_recipes_in_the_docs_are_the_apps_the_tests_run`` checks); ``/signup``, a
plain-function task on another queue, is the tests' own."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from tether import ConfigError, EnqueueError, InvalidArguments, TaskNotFound, TaskStatus, Tether
from tether.contrib.fastapi import TetherApp, lifespan

app = Tether()  # TETHER_URL, TETHER_NAMESPACE

FAST = {"heartbeat_interval": 0.1, "heartbeat_ttl": 0.5, "reclaim_interval": 0.2}


@app.task
async def add(x: int, y: int) -> int:
    return x + y


@app.task(queue="emails", retries=2)
def send_welcome(email: str) -> str:  # a plain function: runs in the worker's threads
    return f"welcome sent to {email}"


class Signup(BaseModel):
    email: str


def routes(api: FastAPI) -> FastAPI:
    @api.post("/signup", status_code=202)
    async def signup(body: Signup) -> dict[str, str]:
        handle = await send_welcome.enqueue(body.email)
        return {"task_id": handle.id}

    # The two views of the recipe in docs/producers.md, word for word (a test compares them).
    @api.post("/add", status_code=202)
    async def enqueue_add(arguments: dict[str, int]) -> dict[str, str]:
        try:
            handle = await add.enqueue(**arguments)  # the body's fields are the task's arguments
        except InvalidArguments as exc:  # {"x": 2}: the same request would fail again
            raise HTTPException(422, str(exc)) from None
        except EnqueueError as exc:  # the server is down or full: worth trying again later
            raise HTTPException(503, str(exc)) from None
        return {"task_id": handle.id}

    @api.get("/tasks/{task_id}")
    async def task_status(task_id: str, tether: TetherApp) -> dict[str, object]:
        try:
            handle = tether.handle(task_id)
            status = await handle.status()
        except ConfigError as exc:  # not a task id at all: "favicon.ico", a cut copy
            raise HTTPException(422, str(exc)) from None
        except TaskNotFound:  # a task id, but no such task (or its record expired)
            raise HTTPException(404, f"no task {task_id}") from None
        result = await handle.result() if status is TaskStatus.SUCCEEDED else None
        return {"status": status.value, "result": result}

    return api


api = routes(FastAPI(lifespan=lifespan(app)))
api_with_worker = routes(
    FastAPI(lifespan=lifespan(app, worker={"queues": ("default", "emails"), **FAST}))
)
