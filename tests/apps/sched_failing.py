"""An app whose half-second schedule always fails, with a short failure backoff,
for the scheduler processes of the backoff tests (TETHER_URL and TETHER_NAMESPACE)."""

from __future__ import annotations

from tether import ScheduleBackoff, Tether

REST = ScheduleBackoff(initial=4, factor=2, cap=60)
"""A first failure rests 4 s, a second 8 s."""


def declare(app: Tether) -> None:
    @app.periodic(every=0.5, name="failing-beat", backoff=REST)
    @app.task(name="failing.beat", retries=0)
    async def beat() -> None:
        raise RuntimeError("the downstream service is down")


app = Tether()
declare(app)
