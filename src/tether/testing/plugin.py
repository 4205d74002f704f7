"""The pytest plugin (entry point ``pytest11``, name ``tether``; ``-p no:tether`` turns it off).

Fixtures, all named ``tether_*`` so they never clash with a project's own:

- ``tether_server`` (session): the URL of a server for the tests: ``--tether-url``, the ini
  option ``tether_url`` or ``TETHER_TEST_URL``, else an embedded Valkey started at first use
  (the ``embedded`` extra). Nothing is started unless a test asks for it.
- ``tether_base_app`` (session): the project's app, from the ini option ``tether_app``
  (``module:attribute``), else a new ``Tether()``. Override it in a conftest to give yours.
- ``tether_app``: that app pointed at ``tether_server`` under a namespace of its own, whose
  keys are deleted after the test.
- ``tether_drain``: ``tether_drain()`` runs burst workers for ``tether_app`` until its queues
  and delayed sets are empty (``await tether_drain.drain()`` in an async test).
- ``tether_eager`` and ``tether_recording``: the base app in eager or recording mode, for
  tests that need no server.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .. import Tether, WorkerCounters
    from ._eager import Eager
    from ._memory import Recorder


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tether")
    group.addoption(
        "--tether-url",
        dest="tether_url",
        default=None,
        help="Redis URL for the tether_server fixture instead of an embedded server "
        "(also TETHER_TEST_URL).",
    )
    parser.addini("tether_url", "Redis URL for the tether_server fixture", default="")
    parser.addini("tether_app", "module:attribute of the app that tether_app isolates", default="")


@pytest.fixture(scope="session")
def tether_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of the tests' server (an embedded Valkey unless one is given)."""
    config = request.config
    url = (
        config.getoption("tether_url")
        or config.getini("tether_url")
        or os.environ.get("TETHER_TEST_URL")
    )
    if url:
        yield str(url)
        return
    from ..base._embedded import EmbeddedServer, embedded_binary

    server = EmbeddedServer(embedded_binary()).start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def tether_base_app(request: pytest.FixtureRequest) -> Tether:
    """The app the other fixtures work on (ini ``tether_app``, else a new one)."""
    from .. import Task, Tether

    spec = str(request.config.getini("tether_app") or "")
    if not spec:
        return Tether()
    module_name, _, attr = spec.partition(":")
    app = getattr(importlib.import_module(module_name), attr or "app", None)
    if not isinstance(app, Tether):
        kind = "Task" if isinstance(app, Task) else type(app).__name__
        raise pytest.UsageError(f"tether_app = {spec}: {kind}, not a Tether app")
    return app


@pytest.fixture
def tether_app(tether_server: str, tether_base_app: Tether) -> Iterator[Tether]:
    """The base app on the tests' server, in a namespace of its own for this test."""
    from ._server import isolated

    with isolated(tether_base_app, tether_server) as app:
        yield tether_base_app
        if app.is_open:
            pytest.fail("the test left tether_app open: use `async with tether_app:` so it closes")


class Drainer:
    """Runs burst workers until the queues and delayed sets are empty (see
    :func:`tether.testing.drain` for the options)."""

    def __init__(self, app: Tether) -> None:
        self.app = app

    def __call__(self, **options: Any) -> WorkerCounters:
        """Blocking; in an async test use ``await tether_drain.drain()``."""
        from ._server import drain_sync

        return drain_sync(self.app, **options)

    async def drain(self, **options: Any) -> WorkerCounters:
        from ._server import drain

        return await drain(self.app, **options)


@pytest.fixture
def tether_drain(tether_app: Tether) -> Drainer:
    """``tether_drain()``: run ``tether_app``'s queued and delayed tasks to their outcomes."""
    return Drainer(tether_app)


@pytest.fixture
def tether_eager(tether_base_app: Tether) -> Iterator[Eager]:
    """The base app in eager mode: tasks run at enqueue, no server needed."""
    from ._eager import Eager

    with Eager(tether_base_app) as queue:
        yield queue


@pytest.fixture
def tether_recording(tether_base_app: Tether) -> Iterator[Recorder]:
    """The base app in recording mode: enqueues are recorded, nothing runs."""
    from ._memory import Recorder

    with Recorder(tether_base_app) as queue:
        yield queue
