"""The failure backoff policy of a schedule: its delays, its checks, how it is stored."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tether import ConfigError, ScheduleBackoff
from tether.base._schedule import DEFAULT_BACKOFF, Schedule
from tether.protocol._envelope import BACKOFF_SPEC


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    policy = ScheduleBackoff(initial=30, factor=2, cap=3600)
    assert [policy.delay(n) for n in range(1, 10)] == [
        30, 60, 120, 240, 480, 960, 1920, 3600, 3600,
    ]  # fmt: skip
    assert policy.delay(10_000) == 3600  # no overflow however long it fails
    assert ScheduleBackoff(initial=timedelta(minutes=2), cap=timedelta(hours=1)).initial == 120


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"initial": 0}, "initial=0"),
        ({"initial": -1}, "initial=-1"),
        ({"cap": float("inf")}, "finite"),
        ({"factor": 0.5}, "factor=0.5"),
        ({"factor": True}, "factor=True"),
        ({"initial": 60, "cap": 30}, "below initial"),
        ({"forget_after": "1d"}, "forget_after='1d'"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_value(options: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(".", r"\.")):
        ScheduleBackoff(**options)  # type: ignore[arg-type]


def test_the_default_is_on_and_false_turns_it_off() -> None:
    on = Schedule(name="s", task="t", every=60)
    assert on.backoff is DEFAULT_BACKOFF
    assert Schedule(name="s", task="t", every=60, backoff=True).backoff is DEFAULT_BACKOFF
    assert Schedule(name="s", task="t", every=60, backoff=False).backoff is None
    with pytest.raises(ConfigError, match="backoff=30"):
        Schedule(name="s", task="t", every=60, backoff=30)  # type: ignore[arg-type]


def test_a_stored_definition_keeps_its_policy_and_an_older_one_gets_the_default() -> None:
    custom = Schedule(name="s", task="t", every=60, backoff=ScheduleBackoff(initial=5, cap=50))
    assert Schedule.from_json(custom.to_json()) == custom
    off = Schedule(name="s", task="t", every=60, backoff=False)
    assert Schedule.from_json(off.to_json()).backoff is None
    older = '{"name": "s", "task": "t", "every": 60}'  # stored before backoff existed
    assert Schedule.from_json(older).backoff is DEFAULT_BACKOFF


def test_the_spec_runs_carry_is_what_the_envelope_check_accepts() -> None:
    for policy in (DEFAULT_BACKOFF, ScheduleBackoff(initial=0.5, factor=1.5, cap=7.25)):
        assert BACKOFF_SPEC.fullmatch(policy.spec), policy.spec
    assert DEFAULT_BACKOFF.spec == "60000|2|3600000|86400000"
    for bad in ("", "0|2|1|1", "1|2|1", "1|x|1|1", "1|2|1|1|name"):
        assert BACKOFF_SPEC.fullmatch(bad) is None, bad
