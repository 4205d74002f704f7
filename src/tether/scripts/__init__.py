"""Lua scripts, one file per atomic step, each opening with its KEYS/ARGV contract.

A :class:`Script` runs with EVALSHA and falls back to EVAL when the server does not know
it (after a restart or a ``SCRIPT FLUSH``), on a standalone server, a Cluster node (the
first key routes it) or a Sentinel-managed master alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from .._redis import AsyncClient, SyncClient

Arg = str | bytes | int | float


class Script:
    """A Lua script from this folder, addressed by its SHA1."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str) -> None:
        self.name = name
        self.text = resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8")
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    async def __call__(
        self, client: AsyncClient, keys: Sequence[Arg], args: Sequence[Arg] = ()
    ) -> Any:
        run: Any = client.execute_command
        try:
            return await run("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await run("EVAL", self.text, len(keys), *keys, *args)

    def run_sync(self, client: SyncClient, keys: Sequence[Arg], args: Sequence[Arg] = ()) -> Any:
        run: Any = client.execute_command
        try:
            return run("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return run("EVAL", self.text, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"Script({self.name!r})"


ENQUEUE = Script("enqueue")
FETCH = Script("fetch")
SETTLE = Script("settle")
CLAIM = Script("claim")
HANDOFF = Script("handoff")
RENEW = Script("renew")
RELEASE = Script("release")
PRUNE = Script("prune")
PROMOTE = Script("promote")
STATUS = Script("status")
CANCEL = Script("cancel")
DEAD_RETRY = Script("dead_retry")
START = Script("start")
TICK = Script("tick")
LEAD = Script("lead")
APPEND = Script("append")
