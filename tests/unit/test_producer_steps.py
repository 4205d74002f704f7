"""Enqueue as a pure step: what an enqueue call will send, computed without a server."""

from __future__ import annotations

from typing import Any

from tether import Tether
from tether.producer import CHUNK, Plan, handles_of, write_of


def app_and_task() -> tuple[Tether, Any]:
    app = Tether("redis://127.0.0.1:9/0", namespace="steps")  # never connected

    @app.task(name="steps.add")
    async def add(x: int, y: int) -> int:
        return x + y

    return app, add


def test_one_plain_task_is_one_xadd_and_a_batch_is_chunked_append_calls() -> None:
    app, add = app_and_task()
    plan = Plan.of(app, add)
    one = write_of(app, add, plan, [((1, 2), {})], None)
    (step,) = one.steps
    assert step.call is None and step.command is not None
    assert step.command[:4] == ("XADD", "{steps:default}:stream:normal", "*", "m")
    assert step.command[4] == one.payloads[0] and one.ids == []
    many = write_of(app, add, plan, [((i, i), {}) for i in range(CHUNK + 1)], None)
    assert [s.command for s in many.steps] == [None, None]
    assert [len(s.call.args) for s in many.steps if s.call is not None] == [CHUNK, 1]
    handles = handles_of(app, one, ["1-0"])
    assert [h.id for h in handles] == ["default:2-1-0"]


def test_a_delayed_or_keyed_task_is_the_enqueue_script_with_an_id_of_its_own() -> None:
    app, add = app_and_task()
    delayed = add.options(delay=60, priority="high")
    plan = Plan.of(app, delayed)
    write = write_of(app, delayed, plan, [((1, 2), {})], {"trace": "t"})
    (step,) = write.steps
    assert step.call is not None and step.call.script.name == "enqueue"
    (task_id,) = write.ids
    assert task_id.startswith("default:") and len(task_id) == len("default:") + 32
    assert task_id in step.call.args and b'"trace"' in write.payloads[0]
