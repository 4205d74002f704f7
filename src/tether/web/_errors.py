"""Tether's errors as HTTP answers with a JSON body, never a 500.

The mapping lives in the routes themselves (:class:`TetherRoute`), not in app-level
exception handlers, so a router mounted in someone else's app answers the same way.

=========================================  ======
unknown task, queue, entry, schedule        404
a malformed id or parameter                 422 (the body has FastAPI's validation shape)
an operation that does not apply            409
the server cannot be reached, or is full    503
the server refused a command otherwise      502
=========================================  ======
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from redis.exceptions import RedisError, ResponseError

from ..base._errors import ConfigError, NotOpen, QueueNotFound, TaskNotFound, TetherError
from ..base._faults import TRANSIENT_ERRORS, is_out_of_memory

log = logging.getLogger("tether.web")


class ErrorBody(BaseModel):
    """What went wrong, in words."""

    detail: str


class ValidationItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class ValidationBody(BaseModel):
    """A malformed parameter or body (FastAPI's validation error shape)."""

    detail: list[ValidationItem]


class NotApplicable(TetherError):
    """The request is well-formed but does not apply (409): a declared schedule cannot be
    removed, a dead letter whose payload is unreadable cannot be retried."""


def error_response(exc: BaseException) -> JSONResponse | None:
    """The answer for one of Tether's or Redis's errors; None for anything else."""
    if isinstance(exc, (TaskNotFound, QueueNotFound, LookupError)):
        return JSONResponse({"detail": str(exc)}, status_code=404)
    if isinstance(exc, ConfigError):
        # The shape of FastAPI's own 422, so one schema describes both.
        body = {"detail": [{"loc": ["request"], "msg": str(exc), "type": "value_error"}]}
        return JSONResponse(body, status_code=422)
    if isinstance(exc, NotOpen):
        return JSONResponse({"detail": str(exc)}, status_code=503)
    if isinstance(exc, TetherError):
        return JSONResponse({"detail": str(exc)}, status_code=409)
    if isinstance(exc, RedisError) and is_out_of_memory(exc):
        return JSONResponse({"detail": f"the server is full: {exc}"}, status_code=503)
    if isinstance(exc, ResponseError):
        return JSONResponse({"detail": f"the server refused: {exc}"}, status_code=502)
    if isinstance(exc, (RedisError, *TRANSIENT_ERRORS)):
        return JSONResponse({"detail": f"the server cannot be reached: {exc}"}, status_code=503)
    return None


class TetherRoute(APIRoute):
    """An API route whose Tether and Redis errors become JSON answers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = error_response(exc)
                if answer is None:
                    raise
                if answer.status_code >= 500:
                    log.warning("%s %s: %s", request.method, request.url.path, exc)
                return answer

        return handle


COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No token or session (standalone mode)"},
    403: {"model": ErrorBody, "description": "Read-only mode, or a missing CSRF token"},
    422: {"model": ValidationBody, "description": "A malformed id, parameter or body"},
    502: {"model": ErrorBody, "description": "The Redis server refused a command"},
    503: {"model": ErrorBody, "description": "The Redis server cannot be reached"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such queue, task, entry or schedule"}
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "The operation does not apply"}
}
