"""Invalid settings fail at start-up with an error naming the setting."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tether import ConfigError, Tether, WorkerSettings
from tether.base._redis import parse_url


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrency": 0}, "concurrency=0: must be 1 or more"),
        ({"concurrency": 4, "max_pending": 2}, "max_pending=2 is below concurrency=4"),
        (
            {"heartbeat_interval": 2, "heartbeat_ttl": 2},
            "heartbeat_ttl=2.0 must exceed heartbeat_interval",
        ),
        (
            {"heartbeat_ttl": 10, "stall_timeout": 5},
            "stall_timeout=5.0 must be at least heartbeat_ttl",
        ),
        ({"reclaim_interval": -1}, "reclaim_interval=-1: must be more than zero"),
        ({"queues": ()}, "at least one queue"),
        ({"queues": ("a b",)}, "queue 'a b' is not a valid name"),
        ({"queues": ("a", "a")}, "listed twice"),
        ({"name": "abandoned"}, "'abandoned' is reserved"),
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"shutdown_grace": "soon"}, "shutdown_grace='soon'"),
    ],
)
def test_invalid_worker_settings(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkerSettings(**settings)  # type: ignore[arg-type]


def test_durations_accept_timedelta() -> None:
    s = WorkerSettings(
        heartbeat_interval=timedelta(milliseconds=500), heartbeat_ttl=timedelta(seconds=3)
    )
    assert (s.heartbeat_interval, s.heartbeat_ttl) == (0.5, 3.0)
    assert s.max_pending == s.concurrency == 16


def test_settings_from_environment() -> None:
    s = WorkerSettings.from_env(
        environ={"TETHER_CONCURRENCY": "8", "TETHER_QUEUES": "a,b", "TETHER_BURST": "yes"}
    )
    assert (s.concurrency, s.queues, s.burst) == (8, ("a", "b"), True)
    with pytest.raises(ConfigError, match="concurrency: the environment value 'many'"):
        WorkerSettings.from_env(environ={"TETHER_CONCURRENCY": "many"})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:6379", "expected a URL"),
        ("http://localhost", "scheme 'http' is unknown"),
        ("redis://:pw@localhost:notaport", "is malformed"),
        ("redis://localhost/abc", "database 'abc' is not a number"),
        ("redis+sentinel://localhost:26379", "names no master"),
        ("redis+cluster://localhost:7000/3", "a cluster has only database 0"),
    ],
)
def test_malformed_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Tether(url)


def test_password_is_hidden_in_messages_and_logs() -> None:
    target = parse_url("redis://user:secret@localhost:6379/2")
    assert "secret" not in target.redacted
    assert (target.username, target.password, target.db) == ("user", "secret", 2)
    with pytest.raises(ConfigError) as info:
        Tether("redis://:secret@localhost:bad")
    assert "secret" not in str(info.value)


def test_cluster_and_sentinel_urls() -> None:
    cluster = parse_url("redis+cluster://a:7000,b:7001")
    assert (cluster.kind, cluster.nodes) == ("cluster", (("a", 7000), ("b", 7001)))
    sentinel = parse_url("redis+sentinel://:pw@s1:26379,s2/mymaster/3?sentinel_password=x")
    assert sentinel.kind == "sentinel"
    assert (sentinel.service, sentinel.db, sentinel.password) == ("mymaster", 3, "pw")
    assert sentinel.nodes == (("s1", 26379), ("s2", 26379))
    assert sentinel.options["sentinel_password"] == "x"


def test_task_declaration_errors() -> None:
    app = Tether("redis://localhost:1")
    with pytest.raises(ConfigError, match="priority 'urgent' is unknown"):
        app.task(priority="urgent")(lambda: None)
    with pytest.raises(ConfigError, match="retries=-1"):
        app.task(retries=-1)(lambda: None)
    with pytest.raises(ConfigError, match="timeout=0"):
        app.task(timeout=0)(lambda: None)

    @app.task
    async def t() -> None: ...

    with pytest.raises(ConfigError, match="already registered"):
        app.task(name=t.name)(lambda: None)
    with pytest.raises(ConfigError, match="delay=-1"):
        t.options(delay=-1)
    with pytest.raises(ConfigError, match="naive datetime"):
        t.options(at=datetime(2030, 1, 1))
    with pytest.raises(ConfigError, match="priority 'top' is unknown"):
        t.options(priority="top")


def test_public_names_are_sorted_and_importable() -> None:
    import tether

    assert tether.__all__ == sorted(tether.__all__)
    for name in tether.__all__:
        assert hasattr(tether, name), name
