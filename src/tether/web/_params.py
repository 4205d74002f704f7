"""What the API's routes and the pages share: parameter types, and the dependency of
state-changing routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Path, Query, Request

from ..admin import DEFAULT_LIMIT, MAX_LIMIT
from ._context import WebContext
from ._guard import require_write
from ._models import ENTRY_PATTERN, QUEUE_PATTERN

QueueName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="A queue name.")]
EntryId = Annotated[
    str, Path(pattern=ENTRY_PATTERN, description="A dead-letter entry id (ms-seq).")
]
Cursor = Annotated[
    str | None,
    Query(max_length=500, description="The cursor of the previous page (absent: the first)."),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Items per page.")]
DEFAULT = DEFAULT_LIMIT


def writer(ctx: WebContext) -> Callable[[Request], Awaitable[str]]:
    """The dependency of state-changing routes: 403 in read-only mode or without the CSRF
    token; gives the caller's name for the audit log."""

    async def check(request: Request) -> str:
        return await require_write(ctx, request)

    return check
