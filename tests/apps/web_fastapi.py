"""The FastAPI recipe of docs/producers.md as a module the tests serve with uvicorn: ``api``
enqueues for a separate ``tether worker``; ``api_with_worker`` runs its worker in-process."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from tether import ConfigError, TaskFailed, TaskNotFound, TaskStatus, Tether
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

    @api.post("/add", status_code=202)
    async def enqueue_add(x: int, y: int) -> dict[str, str]:
        return {"task_id": (await add.enqueue(x, y)).id}

    @api.get("/tasks/{task_id}")
    async def task_status(task_id: str, tether: TetherApp) -> dict[str, Any]:
        try:
            handle = tether.handle(task_id)
            status = await handle.status()
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None
        except TaskNotFound:
            raise HTTPException(404, f"no task {task_id}") from None
        out: dict[str, Any] = {"id": task_id, "status": status.value}
        if status is TaskStatus.SUCCEEDED:
            out["result"] = await handle.result()
        elif status.is_final:
            try:
                await handle.result()
            except TaskFailed as exc:
                out["error"] = f"{exc.error_type}: {exc.error_message}"
        return out

    return api


api = routes(FastAPI(lifespan=lifespan(app)))
api_with_worker = routes(
    FastAPI(lifespan=lifespan(app, worker={"queues": ("default", "emails"), **FAST}))
)
