"""A Lua script addressed by its SHA1, and a prepared call of one (keys, arguments and the
parser of its reply) that runs on an asyncio or a blocking client alike."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from .._redis import AsyncClient, SyncClient

Arg = str | bytes | int | float
T = TypeVar("T")


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


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One prepared script call: ``await call.run(client)`` or ``call.run_sync(client)``."""

    script: Script
    keys: Sequence[Arg]
    args: Sequence[Arg]
    parse: Callable[[Any], T]

    async def run(self, client: AsyncClient) -> T:
        return self.parse(await self.script(client, self.keys, self.args))

    def run_sync(self, client: SyncClient) -> T:
        return self.parse(self.script.run_sync(client, self.keys, self.args))

    @property
    def evalsha(self) -> tuple[Arg, ...]:
        """The EVALSHA command, for a pipeline (run :meth:`run` once first, or after a
        NOSCRIPT error, so the server knows the script)."""
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


ENQUEUE = Script("enqueue")
APPEND = Script("append")
FETCH = Script("fetch")
SETTLE = Script("settle")
CLAIM = Script("claim")
START = Script("start")
HANDOFF = Script("handoff")
RENEW = Script("renew")
RELEASE = Script("release")
PRUNE = Script("prune")
PROMOTE = Script("promote")
STATUS = Script("status")
CANCEL = Script("cancel")
DEAD_RETRY = Script("dead_retry")
TICK = Script("tick")
LEAD = Script("lead")
