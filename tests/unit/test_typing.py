"""The public API is typed as it behaves: mypy --strict accepts what works at run time
(``await add(1, 2)`` on an async task, a ``timedelta`` wherever a duration is taken) and
refuses what does not."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

from tether.scheduler import Schedule

ROOT = Path(__file__).resolve().parents[2]

ACCEPTED = """
    from datetime import timedelta

    from tether import Tether
    from tether.scheduler import Schedule

    from tether import WorkerSettings

    app = Tether(
        result_ttl=timedelta(hours=1),
        pool_timeout=timedelta(seconds=5),
        stats_window=timedelta(days=1),
        socket_timeout=timedelta(seconds=5),
        connect_timeout=timedelta(seconds=1),
        enqueue_replicas_timeout=timedelta(seconds=2),
    )
    settings = WorkerSettings(
        heartbeat_interval=timedelta(seconds=1), heartbeat_ttl=5, give_up_after=timedelta(minutes=1)
    )
    ttl: float = settings.heartbeat_ttl  # read as seconds
    give_up: float | None = settings.give_up_after

    @app.task(timeout=timedelta(seconds=30), result_ttl=timedelta(minutes=5))
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def mul(a: int, b: int) -> int:
        return a * b

    @app.periodic(every=timedelta(minutes=1))
    @app.task
    async def tick() -> None:
        pass

    async def main() -> None:
        total: int = await add(1, 2)  # an async task called in-process is awaited
        product: int = mul(2, 3)  # a plain one returns its result
        await tick()  # @app.periodic keeps the task's type
        later = add.options(
            delay=timedelta(seconds=5), key_ttl=timedelta(minutes=1), timeout=timedelta(seconds=3)
        )
        handle = await later.enqueue(1, 2)
        value: int = await handle.result(timeout=timedelta(seconds=10))
        again: int = await later(1, 2)  # options() keeps the kind of task
        Schedule(name="every-five", task="t", every=timedelta(minutes=5))
        print(total, product, value, again, ttl, give_up)
"""

REFUSED = """
    from datetime import timedelta

    from tether import Tether, WorkerSettings

    app = Tether()

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def mul(a: int, b: int) -> int:
        return a * b

    async def main() -> None:
        await add(1, "two")
        text: str = await add(1, 2)
        await mul(2, 3)

    WorkerSettings(heartbeat_ttl="10s")
    WorkerSettings(connect_timeout=5)
    late: timedelta = WorkerSettings().heartbeat_ttl
"""


def run_mypy(tmp_path: Path, **samples: str) -> list[str]:
    for name, code in samples.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
    files = [str(tmp_path / f"{name}.py") for name in samples]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    return [line for line in result.stdout.splitlines() if ": error:" in line]


def test_mypy_accepts_awaiting_an_async_task_and_timedelta_durations_and_refuses_misuse(
    tmp_path: Path,
) -> None:
    errors = run_mypy(tmp_path, accepted=ACCEPTED, refused=REFUSED)
    assert not [e for e in errors if "accepted.py" in e], "\n".join(errors)
    refused = [e for e in errors if "refused.py" in e]
    assert len(refused) == 6, "\n".join(errors)
    assert 'Argument 2 to "__call__" of "AsyncTask"' in refused[0]
    assert "Incompatible types in assignment" in refused[1]
    assert 'Incompatible types in "await" (actual type "int"' in refused[2]  # a plain task
    assert 'Argument "heartbeat_ttl" to "WorkerSettings" has incompatible type "str"' in refused[3]
    assert 'Unexpected keyword argument "connect_timeout" for "WorkerSettings"' in refused[4]
    assert 'expression has type "float", variable has type "timedelta"' in refused[5]


def test_the_constructor_type_checkers_see_lists_each_field_of_a_schedule() -> None:
    """Schedule declares its constructor for type checkers (to take a timedelta): it must
    name every field, in order, with the field's default."""
    source = (ROOT / "src" / "tether" / "base" / "_schedule.py").read_text()
    declared = next(
        node
        for cls in ast.walk(ast.parse(source))
        if isinstance(cls, ast.ClassDef) and cls.name == "Schedule"
        for node in ast.walk(cls)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    params = declared.args.kwonlyargs
    defaults = declared.args.kw_defaults
    fields = dataclasses.fields(Schedule)
    assert [p.arg for p in params] == [f.name for f in fields]
    for field, default in zip(fields, defaults, strict=True):
        if field.default_factory is not dataclasses.MISSING or field.name == "backoff":
            # ``...`` stands for a default no literal spells (a factory, DEFAULT_BACKOFF)
            assert isinstance(default, ast.Constant) and default.value is Ellipsis, field.name
        elif field.default is dataclasses.MISSING:
            assert default is None, field.name
        else:
            assert default is not None, field.name
            assert ast.literal_eval(default) == field.default, field.name
