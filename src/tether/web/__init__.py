"""The dashboard and the management API of a Tether app, on FastAPI
(``pip install 'tether-queue[web]'``).

The dashboard's pages are at the root (``/``: the overview; ``/queues/{queue}``, ``/task``,
``/workers``, ``/schedules``, ``/stats``), the JSON API under ``/api``. Two ways to serve
both:

- **Standalone**: ``tether web myapp:app --bind 127.0.0.1:8080``, or :func:`create_app` in
  your own uvicorn. Every endpoint needs the token (``Authorization: Bearer <token>`` for
  scripts; the login page at ``/login`` sets an HttpOnly, SameSite=Strict session cookie for
  browsers, whose state-changing requests carry a CSRF token). ``read_only=True`` answers
  403 to every state-changing call.
- **Mounted** in your FastAPI app: :func:`router`. **Authentication is then your job**: the
  router checks no token. Include it with your own dependencies::

      api.include_router(tether.web.router(app), prefix="/tether",
                         dependencies=[Depends(admin_only)])

The JSON API's schema is at ``/api/openapi.json`` in standalone mode. Every state-changing
call, from the API or a dashboard's button, is logged on the ``tether.web.audit`` logger:
who, what, which ids.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import jinja2  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        f"tether.web needs the 'web' extra ({exc.name} is missing): pip install 'tether-queue[web]'"
    ) from exc

from ._app import create_app
from ._auth import TokenAuth
from ._router import router

__all__ = ["TokenAuth", "create_app", "router"]
