"""The Flask recipe of docs/producers.md: a WSGI app that enqueues with the blocking API,
for the tests' Flask test client and a real ``tether worker tests.apps.web_flask:app``."""

from __future__ import annotations

from typing import Any

from flask import Flask, request

from tether import ConfigError, EnqueueError, ResultTimeout, TaskFailed, TaskNotFound, Tether

app = Tether()  # TETHER_URL, TETHER_NAMESPACE


@app.task(queue="emails")
def send_welcome(email: str) -> str:
    return f"welcome sent to {email}"


@app.task
async def add(x: int, y: int) -> int:
    return x + y


web = Flask(__name__)


@web.post("/signup")
def signup() -> tuple[dict[str, Any], int]:
    email = (request.get_json(silent=True) or {}).get("email")
    if not isinstance(email, str):
        return {"error": "give an email"}, 400
    try:
        handle = send_welcome.enqueue_sync(email)
    except EnqueueError as exc:  # the server is unreachable or full: nothing was lost silently
        return {"error": str(exc)}, 503
    return {"task_id": handle.id}, 202


@web.post("/reports/<int:year>")
def report(year: int) -> tuple[dict[str, Any], int]:
    # The web tier does not import the report code: it enqueues by name.
    handle = app.enqueue_by_name_sync("tests.apps.web_flask_reports.build", year)
    return {"task_id": handle.id}, 202


@web.get("/tasks/<task_id>")
def task_result(task_id: str) -> tuple[dict[str, Any], int]:
    wait = float(request.args.get("wait", "0"))
    try:
        handle = app.handle(task_id)
        return {"status": "succeeded", "result": handle.result_sync(timeout=wait)}, 200
    except ConfigError as exc:
        return {"error": str(exc)}, 400
    except TaskNotFound:
        return {"error": f"no task {task_id}"}, 404
    except ResultTimeout:
        return {"status": handle.status_sync().value}, 200
    except TaskFailed as exc:
        return {"status": exc.status, "error": f"{exc.error_type}: {exc.error_message}"}, 200
