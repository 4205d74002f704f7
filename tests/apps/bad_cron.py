"""An app whose module declares a schedule croniter refuses."""

from __future__ import annotations

from tether import Tether

app = Tether("redis://127.0.0.1:1/0")


@app.periodic(cron="61 * * * *")
@app.task
async def tick() -> None:
    return None
