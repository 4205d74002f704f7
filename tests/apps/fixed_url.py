"""An app whose code names a server that does not exist: only an explicit --url reaches one."""

from __future__ import annotations

from tether import Tether

app = Tether("redis://127.0.0.1:1/0", namespace="nowhere")


@app.task
async def add(x: int, y: int) -> int:
    return x + y
