"""The ``taskiq worker`` command line shared by both taskiq brokers."""

from __future__ import annotations


def worker_argv(script: str, app: str, concurrency: int) -> list[str]:
    """``taskiq worker`` with one worker process (its default is two) running ``concurrency``
    async tasks at once, logging at WARNING."""
    return [
        script,
        "worker",
        app,
        "--workers",
        "1",
        "--max-async-tasks",
        str(concurrency),
        "--log-level",
        "WARNING",
    ]
