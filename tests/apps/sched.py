"""An app with a one-second schedule, for scheduler processes started by the tests."""

from __future__ import annotations

from tether import Tether

app = Tether()


@app.periodic(every=1.0, missed="catchup", catchup_limit=30, name="beat")
@app.task
async def beat() -> None: ...


@app.task
async def report(kind: str) -> str:
    return kind
