"""Health, the caller's session, workers."""

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from ...admin import Health, WorkerInfo
from .._context import WebContext
from .._errors import NOT_FOUND, TetherRoute
from .._guard import csrf_token, needs_csrf, principal
from .._models import Session, WorkerPage
from .._params import DEFAULT, Cursor, Limit

_HEALTH = TypeAdapter(Health)


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute)

    @api.get(
        "/health",
        response_model=Health,
        responses={503: {"model": Health, "description": "The server cannot be reached"}},
        tags=["health"],
    )
    async def health() -> Response:
        """Whether the Redis server answers (503 when not), its kind and version, and the
        scheduler leader."""
        report = await (await ctx.stats()).health()
        body = _HEALTH.dump_python(report, mode="json")
        return JSONResponse(body, status_code=200 if report.reachable else 503)

    @api.get("/session", response_model=Session, tags=["health"])
    async def session(request: Request, response: Response) -> Session:
        """How this caller is authenticated, and the CSRF token to send back in the
        ``X-CSRF-Token`` header of state-changing requests (null when not needed)."""
        found = principal(request)
        method = found.method if found is not None else "host"
        token = csrf_token(request, response) if needs_csrf(ctx, request) else None
        return Session(authenticated_by=method, csrf_token=token, read_only=ctx.read_only)

    @api.get("/workers", response_model=WorkerPage, tags=["workers"])
    async def workers(cursor: Cursor = None, limit: Limit = DEFAULT) -> WorkerPage:
        """Live workers in name order, from the registry their heartbeats publish."""
        page = await (await ctx.stats()).workers(cursor=cursor, limit=limit)
        return WorkerPage(items=page.items, cursor=page.cursor)

    @api.get("/workers/{name}", response_model=WorkerInfo, responses=NOT_FOUND, tags=["workers"])
    async def worker(name: Annotated[str, Path(max_length=200)]) -> WorkerInfo:
        """One live worker's record."""
        found = await (await ctx.stats()).worker(name)
        if found is None:
            raise LookupError(f"no live worker named {name!r}")
        return found

    return api
