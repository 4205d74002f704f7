"""The Flask recipe of docs/producers.md: a WSGI app that enqueues with the blocking API,
for the tests' Flask test client and a real ``tether worker tests.apps.web_flask:app``. Its
views ``signup`` and ``task_result`` and its task ``send_welcome`` are the recipe's, word for
word (``test_the_recipes_in_the_docs_are_the_apps_the_tests_run`` checks); ``/reports`` and
the task ``add`` are the tests' own."""

from __future__ import annotations

from typing import Any

from flask import Flask, request

from tether import (
    ConfigError,
    EnqueueError,
    InvalidArguments,
    ResultTimeout,
    TaskFailed,
    TaskNotFound,
    Tether,
)

app = Tether()  # TETHER_URL, TETHER_NAMESPACE


@app.task(queue="emails")
def send_welcome(email: str) -> str:
    return f"welcome sent to {email}"


@app.task
async def add(x: int, y: int) -> int:
    return x + y


web = Flask(__name__)


# The two views of the recipe in docs/producers.md, word for word (a test compares them).
@web.post("/signup")
def signup() -> tuple[dict[str, object], int]:
    fields = request.get_json(silent=True)
    if not isinstance(fields, dict):
        return {"error": "send a JSON object"}, 400
    try:
        handle = send_welcome.enqueue_sync(**fields)  # the body's fields are the arguments
    except InvalidArguments as exc:  # {"mail": ...}: the same request would fail again
        return {"error": str(exc)}, 422
    except EnqueueError as exc:  # the server is down or full: say so, lose nothing silently
        return {"error": str(exc)}, 503
    return {"task_id": handle.id}, 202


@web.get("/tasks/<task_id>")
def task_result(task_id: str) -> tuple[dict[str, object], int]:
    wait = min(request.args.get("wait", 0.0, type=float), 30.0)  # ?wait=5: up to 5 s
    try:
        handle = app.handle(task_id)
        return {"status": "succeeded", "result": handle.result_sync(timeout=wait)}, 200
    except ConfigError as exc:  # not a task id at all (or a negative wait)
        return {"error": str(exc)}, 422
    except TaskNotFound:  # a task id, but no such task (or its record expired)
        return {"error": f"no task {task_id}"}, 404
    except ResultTimeout:
        return {"status": handle.status_sync().value}, 200
    except TaskFailed as exc:
        return {"status": exc.status, "error": f"{exc.error_type}: {exc.error_message}"}, 200


@web.post("/reports/<int:year>")
def report(year: int) -> tuple[dict[str, Any], int]:
    # The web tier does not import the report code: it enqueues by name.
    handle = app.enqueue_by_name_sync("tests.apps.web_flask_reports.build", year)
    return {"task_id": handle.id}, 202
