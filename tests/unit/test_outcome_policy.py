"""The outcome policy as plain functions: no server, no worker."""

from __future__ import annotations

import json

import pytest

from tether import Backoff, JsonSerializer, Retry
from tether.protocol._envelope import Envelope
from tether.protocol._keys import QueueKeys
from tether.worker import _outcome as policy

KEYS = QueueKeys.of("ns", "q")
JSON = JsonSerializer()


def no_delay(attempt: int) -> float:
    return 0.5 * attempt


def test_a_listed_exception_is_retried_while_attempts_remain() -> None:
    assert policy.decide(ValueError("x"), 1, 2, (ValueError,), no_delay) == policy.Decision(
        True, 0.5
    )
    assert policy.decide(ValueError("x"), 2, 2, (ValueError,), no_delay).delay == 1.0
    last = policy.decide(ValueError("x"), 3, 2, (ValueError,), no_delay)
    assert not last.retry and last.why_not == "no retries left"


def test_an_exception_outside_retry_on_is_not_retried_and_says_why() -> None:
    decision = policy.decide(TypeError("x"), 1, 3, (ValueError,), no_delay)
    assert not decision.retry
    assert decision.why_not == "not retried: TypeError is not in retry_on (ValueError)"


def test_retry_asks_for_its_own_delay_and_counts_against_retries() -> None:
    assert policy.decide(Retry(delay=7), 1, 1, (), no_delay) == policy.Decision(True, 7)
    assert policy.decide(Retry(), 1, 1, (), no_delay).delay == 0.5
    assert not policy.decide(Retry(delay=7), 2, 1, (), no_delay).retry


def test_backoff_grows_and_stays_capped() -> None:
    backoff = Backoff(base=1, factor=2, cap=5, jitter=0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]


def env(**fields: object) -> Envelope:
    e = Envelope("q:abc", "mod.task", [1], {}, 1000)
    for name, value in fields.items():
        setattr(e, name, value)
    return e


def test_a_plain_success_without_results_is_a_bare_ack() -> None:
    target = policy.Target.of(KEYS, env(), bound=False, store=False, ttl_ms=1000)
    assert policy.success(target, JSON, env(), 5) is policy.BARE_SUCCESS


def test_an_indexed_success_without_results_still_drops_its_index_entry() -> None:
    target = policy.Target.of(KEYS, env(), bound=True, store=False, ttl_ms=1000)
    outcome = policy.success(target, JSON, env(), 5)
    assert (outcome.op, outcome.task_id, outcome.bound, outcome.result_key) == (
        "ok",
        "q:abc",
        True,
        None,
    )


def test_a_success_records_its_value_and_releases_its_dedup_key() -> None:
    e = env(options={"key": "k", "key_ttl": 2.5})
    target = policy.Target.of(KEYS, e, bound=True, store=True, ttl_ms=1000)
    outcome = policy.success(target, JSON, e, {"a": 1})
    assert outcome.result_key == KEYS.result("q:abc") and outcome.done_key == KEYS.done("q:abc")
    assert outcome.dedup_key == KEYS.dedup("k") and outcome.dedup_hold_ms == 2500
    assert json.loads(outcome.record)["value"] == {"a": 1}


def test_a_result_the_serializer_refuses_is_not_a_success() -> None:
    target = policy.Target.of(KEYS, env(), bound=True, store=True, ttl_ms=1000)
    with pytest.raises(TypeError):
        policy.success(target, JSON, env(), object())


def test_dead_and_cancelled_outcomes_are_recorded_even_without_results() -> None:
    target = policy.Target.of(KEYS, env(), bound=True, store=False, ttl_ms=1000)
    dead = policy.dead(target, JSON, env(), "poison")
    assert dead.op == "dead" and dead.result_key is not None and dead.reason == "poison"
    assert json.loads(dead.record)["status"] == "dead"
    cancelled = policy.cancelled(target, JSON, env())
    assert cancelled.op == "cancel" and json.loads(cancelled.record)["status"] == "cancelled"
    unknown = policy.dead(None, JSON, None, "undecodable", "q:1-1-0")
    assert (unknown.op, unknown.task_id, unknown.result_key) == ("dead", "q:1-1-0", None)


def test_a_retry_carries_the_next_attempt_and_its_delay() -> None:
    target = policy.Target.of(KEYS, env(), bound=True, store=True, ttl_ms=1000)
    outcome = policy.retry(target, JSON, env(), {"type": "E"}, 1.25, b"next")
    assert (outcome.op, outcome.retry_delay_ms, outcome.next_payload) == ("retry", 1250, b"next")
    assert json.loads(outcome.record)["status"] == "retrying"
