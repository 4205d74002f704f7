"""Queue pause and resume.

A paused queue has its flag key (``QueueKeys.paused``, holding the time it was paused);
every worker reads the flag in its maintenance pass (the ``promote`` script), so within one
``reclaim_interval`` no worker fetches from the queue, and none reclaims from it. Entries
already delivered run to their end; enqueues are still accepted; delayed tasks are still
moved into the streams when due. Resume deletes the flag: the workers fetch again from where
they stopped at their next pass.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..base._settings import check_name
from ..producer._lifecycle import keys_for
from ..protocol._keys import KNOWN_QUEUES_TTL_MS, known_queues_key

if TYPE_CHECKING:
    from ..producer._core import Core


async def pause(core: Core, queue: str) -> bool:
    """Pause ``queue``; True if it was running, False if it was paused already."""
    check_name("queue", queue)
    pipe: Any = core.client.pipeline(transaction=False)
    pipe.set(core.keys(queue).paused, int(time.time() * 1000), nx=True)
    pipe.zadd(known_queues_key(core.namespace), {queue: 0})
    pipe.pexpire(known_queues_key(core.namespace), KNOWN_QUEUES_TTL_MS)
    newly, _, _ = await pipe.execute()
    return bool(newly)


async def resume(core: Core, queue: str) -> bool:
    """Resume ``queue``; True if it was paused."""
    check_name("queue", queue)
    return bool(await core.client.delete(core.keys(queue).paused))


async def run_now(core: Core, task_id: str) -> bool:
    """Make a delayed task (scheduled, or a retry in its backoff) due at once: the next
    maintenance pass of any worker moves it into its stream (within ``reclaim_interval``).
    False when the task is not waiting for its due time."""
    keys = keys_for(core, task_id)
    # Due at 0: before anything else, by any server's clock; XX: never adds a member.
    return bool(await core.client.zadd(keys.delayed, {task_id: 0}, xx=True, ch=True))


async def is_paused(core: Core, queue: str) -> bool:
    check_name("queue", queue)
    return bool(await core.client.exists(core.keys(queue).paused))
