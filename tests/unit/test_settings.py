"""Invalid settings fail at start-up with an error naming the setting."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re
import textwrap
from datetime import datetime, timedelta

import pytest

from tether import ConfigError, Tether, WorkerSettings
from tether.base._redis import parse_url
from tether.base._settings import AppSettings, OptionalSeconds, Seconds, help_of


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


def test_every_duration_takes_seconds_or_a_timedelta_and_reads_as_seconds() -> None:
    durations = [
        f.name
        for f in dataclasses.fields(WorkerSettings)
        if isinstance(f.default, (Seconds, OptionalSeconds))
    ]
    assert "give_up_after" in durations and "shutdown_grace" in durations
    given = {name: timedelta(minutes=10 + i) for i, name in enumerate(durations)}
    given["stall_timeout"] = timedelta(hours=1)
    s = WorkerSettings(**given)
    for name in durations:
        value = getattr(s, name)
        assert type(value) is float, name
        assert value == given[name].total_seconds(), name
    # Replaced, compared, hashed and pickled as the floats they are.
    assert dataclasses.replace(s, heartbeat_ttl=700.5).heartbeat_ttl == 700.5
    assert pickle.loads(pickle.dumps(s)) == s
    assert hash(dataclasses.replace(s)) == hash(s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.heartbeat_ttl = 3  # type: ignore[misc]
    app = AppSettings(url="redis://x", socket_timeout=timedelta(seconds=3), pool_timeout=4)
    assert (app.socket_timeout, app.pool_timeout, app.connect_timeout) == (3.0, 4.0, 5.0)


def test_give_up_after_is_unset_or_thirty_seconds_in_burst_mode() -> None:
    assert WorkerSettings().give_up_after is None
    assert WorkerSettings(burst=True).give_up_after == 30.0
    assert WorkerSettings(burst=True, give_up_after=timedelta(seconds=2)).give_up_after == 2.0
    with pytest.raises(ConfigError, match="give_up_after=0: must be more than zero"):
        WorkerSettings(give_up_after=0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"connect_timeout": 5},
            "WorkerSettings has no setting 'connect_timeout': it is 'give_up_after' now (how "
            "long the server may stay unreachable",
        ),
        (
            {"heartbeat_tll": 5},
            "WorkerSettings has no setting 'heartbeat_tll': did you mean heartbeat_ttl?",
        ),
        ({"colour": "blue"}, "WorkerSettings has no setting 'colour'"),
    ],
)
def test_a_name_that_is_not_a_setting_is_refused_with_the_right_one(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        WorkerSettings(**given)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape(message)):
        dataclasses.replace(WorkerSettings(), **given)
    old_variable = "TETHER_CONNECT_TIMEOUT is not read: the setting is called TETHER_GIVE_UP_AFTER"
    with pytest.raises(ConfigError, match=old_variable):
        WorkerSettings.from_env(environ={"TETHER_CONNECT_TIMEOUT": "5"})


@pytest.mark.parametrize("cls", [WorkerSettings, AppSettings])
def test_the_docstring_lists_each_settings_help_from_its_field(cls: type) -> None:
    """The help text of a setting is its field's ``metadata["help"]`` (the CLI shows it); the
    docstring's ``Attributes:`` section, which the API reference renders, is made from it.
    After changing a help text, paste the section this test prints."""
    lines = ["Attributes:"]
    for field in dataclasses.fields(cls):
        text = help_of(field)
        assert text, f"{cls.__name__}.{field.name} has no help"
        lines += textwrap.wrap(
            f"{field.name}: {text}",
            width=92,
            initial_indent="    ",
            subsequent_indent="        ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    section = "\n".join(lines)
    doc = inspect.cleandoc(cls.__doc__ or "")
    assert doc.endswith(section), f"{cls.__name__}'s docstring should end with:\n{section}"


def test_settings_from_environment() -> None:
    s = WorkerSettings.from_env(
        environ={
            "TETHER_CONCURRENCY": "8",
            "TETHER_QUEUES": "a,b",
            "TETHER_BURST": "yes",
            "TETHER_HEARTBEAT_TTL": "12.5",
            "TETHER_GIVE_UP_AFTER": "7",
        }
    )
    assert (s.concurrency, s.queues, s.burst) == (8, ("a", "b"), True)
    assert (s.heartbeat_ttl, s.give_up_after) == (12.5, 7.0)
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
