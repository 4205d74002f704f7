"""Transient states of a real server, entered and left on purpose: another client's script
running past ``busy-reply-threshold`` (every other client gets BUSY), and a failed RDB save
under ``stop-writes-on-bgsave-error`` (every write gets MISCONF). A healthy deployment
passes through both; workers must outlive them."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import redis


def _run_quietly(client: redis.Redis, script: str) -> None:
    with contextlib.suppress(redis.RedisError):  # the script is killed: that is the point
        client.eval(script, 0)


@contextlib.contextmanager
def busy_script(url: str, threshold_ms: int = 50) -> Iterator[None]:
    """Within the block, a script that never ends holds the server: every other client's
    command (but SCRIPT KILL) is answered BUSY. The script is killed at the end."""
    admin = redis.Redis.from_url(url, socket_timeout=10)
    looping = redis.Redis.from_url(url)
    admin.config_set("busy-reply-threshold", threshold_ms)
    runner = threading.Thread(target=_run_quietly, args=(looping, "while true do end"), daemon=True)
    runner.start()
    time.sleep(threshold_ms / 1000 + 0.25)  # past the threshold: BUSY from now on
    try:
        yield
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.script_kill()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        runner.join(10)
        admin.close()
        looping.close()


@contextlib.contextmanager
def failed_save(client: redis.Redis) -> Iterator[None]:
    """Within the block the last RDB save has failed (its folder vanished) and
    stop-writes-on-bgsave-error holds: every write is answered MISCONF. The server needs
    ``--enable-protected-configs yes`` (``dir`` is protected from Redis 7 on)."""
    folder = tempfile.mkdtemp(prefix="tether-misconf-")
    before = client.config_get("dir")["dir"]
    save = str(client.config_get("save")["save"] or "")
    client.config_set("save", "3600 1")
    client.config_set("stop-writes-on-bgsave-error", "yes")
    client.config_set("dir", folder)
    shutil.rmtree(folder)
    try:
        client.bgsave()
        deadline = time.monotonic() + 10
        while client.info("persistence")["rdb_last_bgsave_status"] != "err":
            if time.monotonic() > deadline:
                raise AssertionError("the save did not fail")
            time.sleep(0.05)
        yield
    finally:
        client.config_set("dir", before)
        # Writes resume once the failed save is forgotten: turning the check off and on
        # again clears it without a new save.
        client.config_set("stop-writes-on-bgsave-error", "no")
        client.config_set("save", save)
