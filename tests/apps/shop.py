"""An app that names its server and namespace in its own code, as most apps do (here from
variables of its own, so the tests can point it at their server): the CLI's --app must
read both from it."""

from __future__ import annotations

import os

from tether import Tether

app = Tether(
    os.environ.get("SHOP_URL", "redis://127.0.0.1:1/0"),
    namespace=os.environ.get("SHOP_NAMESPACE", "shop"),
)


@app.task(retries=2, retry_on=(ValueError,))
async def charge(order: int) -> str:
    if order < 0:
        raise TypeError(f"order {order} is negative\nsecond line of the message")
    return f"charged {order}"


@app.task(queue="billing")
async def invoice(order: int) -> str:
    if order < 0:
        raise TypeError("no invoice for a negative order")
    return f"invoice {order}"
