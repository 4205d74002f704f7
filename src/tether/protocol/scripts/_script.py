"""A Lua script addressed by its SHA1, and a prepared call of one (keys, arguments and the
parser of its reply) that runs on an asyncio or a blocking client alike."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from ...base._redis import AsyncClient, SyncClient

Arg = str | bytes | int | float
T = TypeVar("T")


_KNOWN: dict[str, Script] = {}
"""Every script, by SHA1: an error names the script by it."""
_SCRIPT_LINE = re.compile(r"script: ([0-9a-f]{40}), on @user_script:(\d+)")
_CALL = re.compile(r"redis\.p?call\(\s*'(\w+)'(?:\s*,\s*'([A-Za-z]+)')?")
_WITH_SUBCOMMAND = {"xinfo", "xgroup", "client", "config", "object", "script"}


class Script:
    """A Lua script from this folder, addressed by its SHA1."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str, text: str | None = None) -> None:
        """The script ``<name>.lua`` of this folder, or ``text`` under that name."""
        self.name = name
        if text is None:
            text = resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8")
        self.text = text
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()
        _KNOWN[self.sha] = self

    def command_at(self, line: int) -> str | None:
        """The command the script calls on ``line`` (counted from 1), as an ACL rule names
        it: ``zrangebyscore``, ``xinfo|groups``."""
        lines = self.text.splitlines()
        found = _CALL.search(lines[line - 1]) if 0 < line <= len(lines) else None
        if found is None:
            return None
        command, sub = found.group(1).lower(), (found.group(2) or "").lower()
        return f"{command}|{sub}" if command in _WITH_SUBCOMMAND and sub else command

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


def refused_in_script(message: str) -> str | None:
    """The command a script of ours was refused, from the server's error (``... script:
    <sha1>, on @user_script:<line>.``): Redis 7.0 names only the script and its line."""
    found = _SCRIPT_LINE.search(message)
    script = _KNOWN.get(found.group(1)) if found else None
    return script.command_at(int(found.group(2))) if found and script else None


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
