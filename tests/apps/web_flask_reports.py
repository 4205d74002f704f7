"""The worker side of the Flask recipe: tasks the web tier enqueues by name only."""

from __future__ import annotations

from tests.apps.web_flask import app


@app.task(name="tests.apps.web_flask_reports.build")
def build(year: int) -> str:
    return f"report {year}"
