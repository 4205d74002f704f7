"""The Django backend, with the real minimal project in tests/django_site and a real
`tether worker` process: the django-tasks backport on this venv's Django 5.2, and Django 6's
django.tasks in a Python 3.12 venv built once and kept beside this one."""

from __future__ import annotations

import asyncio
import fcntl
import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
import tomllib

import tether
from tether import EnqueueError, SerializationError, TaskStatus, Tether
from tether.protocol._keys import QueueKeys

from ..helpers import ROOT, WorkerProcess, wait_until

SITE = ROOT / "tests" / "django_site"
SETTINGS = "djsite.settings"


def site_env(extra_path: str = "") -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SITE), extra_path, str(ROOT)) if p)
    return {"DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONPATH": path}


def django_worker(
    url: str, namespace: str, tmp_path: Path, name: str = "dj", **kwargs: Any
) -> WorkerProcess:
    return WorkerProcess(
        url,
        namespace,
        name,
        app="tether.contrib.django",
        queues="default,emails",
        log_dir=tmp_path,
        env=kwargs.pop("env", None) or site_env(),
        **kwargs,
    )


def run_scenario(python: str, url: str, namespace: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(SITE / "scenario.py")],
        env={**os.environ, **env, "TETHER_URL": url, "TETHER_NAMESPACE": namespace},
        cwd=SITE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check_scenario(out: dict[str, Any], worker_pid: int) -> None:
    assert out["add"] == 5
    assert out["fetched"] == ["SUCCESSFUL", 5, "shop.tasks.add"]
    assert out["receipt"] == ["receipt 7 sent to ann@example.com", "emails"]
    described = out["describe"]
    assert described["tag"] == "ctx" and described["attempt"] == 1
    assert described["id"].startswith("default:") and described["pid"] == worker_pid
    assert out["double"] == 42
    assert out["later"][0] == 2 and out["later"][1] >= 1.0  # run_after was kept
    assert out["failed"] == ["FAILED", "ValueError", True]


# -- the backport, in this venv -----------------------------------------------------------


def test_django_tasks_run_on_a_tether_worker(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], rds: redis.Redis
) -> None:
    worker = django_worker(url, namespace, tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    out = run_scenario(sys.executable, url, namespace, site_env())
    assert out["backport"] is True
    check_scenario(out, worker.pid)
    # Django's signals fired in the worker, as with Django's own backends.
    assert "path=shop.tasks.add state=SUCCESSFUL" in worker.log()
    check_logged_once(worker.log(), "django_tasks")


def check_logged_once(log: str, framework: str) -> None:
    """The worker's log says each thing once: its start line, and a failed task's traceback
    (Django's record keeps it; the worker's line points at it). The start line was logged
    twice (the app was built at each of the loader's two lookups), and a traceback twice
    (Django's logger.exception and the worker's warning)."""
    assert log.count("Django tasks (") == 1, log
    assert log.count(" serving queues default,emails ") == 1, log
    assert log.count("Traceback (most recent call last)") == 1, log
    failed = [line for line in log.splitlines() if "shop.tasks.explode" in line]
    assert "state=FAILED" in failed[-2], log  # Django's record, with the traceback below it
    assert f"ValueError: no ink (traceback: the {framework} line above)" in failed[-1], log
    assert log.count("ValueError: no ink") == 2  # the worker's line and the traceback's end


# -- in-process: the mapping, bad input ---------------------------------------------------


@pytest.fixture(scope="module")
def django_site() -> Iterator[None]:
    """Django set up in this process with the test project's settings."""
    sys.path.insert(0, str(SITE))
    previous = os.environ.get("DJANGO_SETTINGS_MODULE")
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()
    yield
    sys.path.remove(str(SITE))
    if previous is None:
        del os.environ["DJANGO_SETTINGS_MODULE"]


@pytest.fixture
def tasks_backend(django_site: None, url: str, namespace: str) -> Iterator[Any]:
    """The project's TASKS pointed at this test's server and namespace."""
    from django.test.utils import override_settings

    from tether.contrib.django import TetherBackend
    from tether.contrib.django._compat import task_backends

    tasks = {
        "default": {
            "BACKEND": "tether.contrib.django.TetherBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"URL": url, "NAMESPACE": namespace},
        }
    }
    with override_settings(TASKS=tasks):
        backend = task_backends["default"]
        assert isinstance(backend, TetherBackend)
        yield backend
        backend.tether.close_sync()


def test_priority_queue_and_run_after_map_to_tethers(
    tasks_backend: Any, rds: redis.Redis, namespace: str
) -> None:
    from shop import tasks

    default = QueueKeys.of(namespace, "default")
    emails = QueueKeys.of(namespace, "emails")
    tasks.send_receipt.enqueue(1, to="a@b")  # priority 50, queue emails
    tasks.add.using(priority=-3).enqueue(1, 2)
    tasks.add.using(priority=0).enqueue(1, 2)
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    later = tasks.add.using(run_after=at).enqueue(3, 4)
    assert rds.xlen(emails.stream("high")) == 1
    assert rds.xlen(default.stream("low")) == 1 and rds.xlen(default.stream("normal")) == 1
    due_ms = rds.zscore(default.delayed, later.id)
    assert due_ms is not None and abs(due_ms - at.timestamp() * 1000) < 5
    # The same task seen from Tether and from Django.
    assert tasks_backend.tether.handle(later.id).status_sync() is TaskStatus.SCHEDULED
    fetched = tasks.add.get_result(later.id)
    assert fetched.status == "READY" and fetched.args == [3, 4]
    assert fetched.enqueued_at is not None


async def test_the_async_api_of_django_tasks(tasks_backend: Any) -> None:
    """aenqueue and aget_result run the blocking calls off the event loop's thread."""
    from shop import tasks

    result = await tasks.double.aenqueue(4)
    fetched = await tasks.double.aget_result(result.id)
    assert fetched.status == "READY" and fetched.args == [4]
    assert fetched.id == result.id and result.id.startswith("default:2-")


def test_bad_input_is_refused_and_writes_nothing(
    tasks_backend: Any, rds: redis.Redis, namespace: str
) -> None:
    from shop import tasks

    from tether.contrib.django._compat import InvalidTask, TaskResultDoesNotExist

    with pytest.raises(SerializationError, match=r"argument 'x' \(object\) cannot be"):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(EnqueueError, match="missing a required argument: 'y'"):
        tasks.add.enqueue(1)
    with pytest.raises(InvalidTask, match="Queue 'bulk' is not valid"):
        tasks.add.using(queue_name="bulk").enqueue(1, 2)
    assert not list(rds.scan_iter(f"{{{namespace}:*"))
    with pytest.raises(TaskResultDoesNotExist, match="unknown"):
        tasks.add.get_result("default:" + "0" * 32)
    with pytest.raises(TaskResultDoesNotExist, match="not a Tether task id"):
        tasks.add.get_result("nonsense")


def run_burst(backend: Any, *queues: str) -> None:
    """What `tether worker tether.contrib.django --burst` runs, in this process: the signals
    fire here, where a test can receive them."""
    from tether.contrib.django import worker_app

    app = worker_app(backend.alias)
    assert app is backend.tether
    asyncio.run(app.worker(queues=queues or ("default",), burst=True).run())


def test_enqueue_get_result_and_the_signals_agree_on_enqueued_at(tasks_backend: Any) -> None:
    """One source for a task's enqueued_at, whoever reads it: enqueue() gave the producer's
    clock in microseconds while get_result() read milliseconds (the envelope's, or the id's
    once the task ran), so the two results of one waiting task were not equal (as Django's
    own test_get_result compares them), and a task with run_after lost it once it ran."""
    from django.utils import timezone as dj_timezone
    from shop import tasks

    from tether.contrib.django._compat import task_finished, task_started

    now = dj_timezone.now()
    enqueued = {
        "plain": tasks.add.enqueue(1, 2),
        "due": tasks.add.using(run_after=now - timedelta(seconds=1)).enqueue(3, 4),
        "later": tasks.add.using(run_after=now + timedelta(hours=1)).enqueue(5, 6),
    }
    for result in enqueued.values():
        waiting = tasks.add.get_result(result.id)
        assert waiting.enqueued_at == result.enqueued_at and result.enqueued_at is not None
        assert (waiting.status, waiting.args) == (result.status, result.args)
    # Every field, as Django's test_get_result compares them (get_result's task is the
    # module's: the run_after that using() gave is not on it).
    assert tasks.add.get_result(enqueued["plain"].id) == enqueued["plain"]
    seen: dict[str, list[Any]] = {}

    def on_signal(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.setdefault(task_result.id, []).append(task_result.enqueued_at)

    task_started.connect(on_signal)
    task_finished.connect(on_signal)
    try:
        run_burst(tasks_backend)
    finally:
        task_started.disconnect(on_signal)
        task_finished.disconnect(on_signal)
    for name in ("plain", "due"):
        result = enqueued[name]
        ran = tasks.add.get_result(result.id)
        assert ran.status == "SUCCESSFUL", name
        assert seen[result.id] == [result.enqueued_at] * 2, name
        assert ran.enqueued_at == result.enqueued_at, name
        # When it ran, from the stored outcome (was None once the worker's signals had gone).
        assert ran.started_at is not None and ran.started_at == ran.last_attempted_at, name
        assert ran.finished_at is not None, name
        assert ran.enqueued_at <= ran.started_at <= ran.finished_at, name
    waiting = tasks.add.get_result(enqueued["later"].id)
    assert (waiting.started_at, waiting.last_attempted_at) == (None, None)


def test_an_unserialisable_return_value_fails_in_the_signal_the_result_and_the_log(
    tasks_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A return value the serializer cannot encode fails the task everywhere: Django's
    task_finished said SUCCESSFUL (and logged at INFO) while the stored result said FAILED.
    The error is tether.ResultSerializationError, public and a TypeError (Django's immediate
    backend fails such a task with a TypeError)."""
    from shop import tasks

    from tether.contrib.django._compat import FRAMEWORK, task_finished

    finished: list[tuple[str, list[str]]] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        paths = [error.exception_class_path for error in task_result.errors]
        finished.append((str(task_result.status), paths))

    result = tasks.unserialisable.enqueue()
    task_finished.connect(on_finished)
    try:
        with caplog.at_level(logging.INFO):
            run_burst(tasks_backend)
    finally:
        task_finished.disconnect(on_finished)
    assert finished == [("FAILED", ["tether.ResultSerializationError"])]
    fetched = tasks.unserialisable.get_result(result.id)
    assert fetched.status == "FAILED"
    (error,) = fetched.errors
    assert error.exception_class is tether.ResultSerializationError
    assert issubclass(error.exception_class, TypeError)
    assert "the result (dict) cannot be serialized by the json serializer" in error.traceback
    django_lines = [
        r for r in caplog.records if r.name == FRAMEWORK and result.id in r.getMessage()
    ]
    assert [r.levelname for r in django_lines][-2:] == ["INFO", "ERROR"], django_lines
    assert "state=FAILED" in django_lines[-1].getMessage()


@pytest.mark.parametrize(
    ("how", "error"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")]
)
def test_a_django_task_that_exits_fails_and_the_worker_serves_on(
    tasks_backend: Any,
    url: str,
    namespace: str,
    tmp_path: Path,
    workers: list[WorkerProcess],
    rds: redis.Redis,
    how: str,
    error: str,
) -> None:
    """sys.exit() or KeyboardInterrupt in a Django task fails it (FAILED, with the exception
    class, as Django's immediate backend records SystemExit) and the worker runs the next
    task; before, the task took the `tether worker` process down."""
    from shop import tasks

    worker = django_worker(url, namespace, tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    left = tasks.leave.enqueue(how)
    after = tasks.add.enqueue(2, 2)

    def finished(result: Any) -> bool:
        code = worker.process.poll()
        assert code is None, f"the worker exited with {code}:\n{worker.log()}"
        result.refresh()
        return bool(result.is_finished)

    for result in (left, after):
        wait_until(lambda r=result: finished(r), timeout=20)
    assert after.return_value == 4
    assert left.status == "FAILED"
    assert left.errors[0].exception_class.__name__ == error
    assert f"id={left.id} path=shop.tasks.leave state=FAILED" in worker.log()


def test_bad_options_are_reported_by_django_checks(django_site: None) -> None:
    from tether.contrib.django import TetherBackend

    backend = TetherBackend("broken", {"QUEUES": ["ok", "no spaces"], "OPTIONS": {"URL": "nope"}})
    messages = [m.msg for m in backend.check()]
    assert any("TASKS['broken']: url='nope'" in m for m in messages), messages
    assert any("'no spaces' is not a valid name" in m for m in messages), messages
    unknown = TetherBackend("typo", {"OPTIONS": {"URLL": "redis://x"}})
    assert "unknown OPTIONS URLL (did you mean URL?)" in next(iter(unknown.check())).msg


def test_options_are_the_apps_settings_and_a_worker_setting_is_named(django_site: None) -> None:
    """OPTIONS are the fields of the app's settings, checked by them (a duration takes a
    timedelta); a worker setting there is refused with the worker option to use instead."""
    from django.core.exceptions import ImproperlyConfigured

    from tether.contrib.django import TetherBackend

    backend = TetherBackend(
        "timed", {"OPTIONS": {"URL": "redis://x", "SOCKET_TIMEOUT": timedelta(seconds=3),
                              "connect_timeout": 2}},
    )  # fmt: skip
    assert backend.tether.settings.socket_timeout == 3.0
    assert backend.tether.settings.connect_timeout == 2.0
    for options, message in [
        ({"URL": "redis://x", "GIVE_UP_AFTER": 5},
         "TASKS['bad']: unknown OPTIONS GIVE_UP_AFTER (a worker setting, not the app's: give it "
         "to the worker, tether worker tether.contrib.django --give-up-after ...)"),
        ({"CONCURRENCY": 5, "NAMESPAC": "shop"},
         "TASKS['bad']: unknown OPTIONS CONCURRENCY (a worker setting, not the app's: give it to "
         "the worker, tether worker tether.contrib.django --concurrency ...), NAMESPAC (did you "
         "mean NAMESPACE?) (known: APP, CONNECT_TIMEOUT, DEAD_LETTER_MAXLEN,"),
        ({"URL": "redis://x", "POOL_TIMEOUT": -1}, "TASKS['bad']: pool_timeout=-1: must be more"),
    ]:  # fmt: skip
        with pytest.raises(ImproperlyConfigured) as info:
            TetherBackend("bad", {"OPTIONS": options}).tether  # noqa: B018 - builds the app
        assert str(info.value).startswith(message), str(info.value)


@pytest.fixture
def site_app_module(
    django_site: None, url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """djsite.tether_app imported afresh with this test's server and namespace (it reads
    them from the environment when imported); the namespace of its app is returned."""
    monkeypatch.setenv("TETHER_URL", url)
    monkeypatch.setenv("TETHER_NAMESPACE", namespace)
    sys.modules.pop("djsite.tether_app", None)
    yield f"{namespace}-app"
    module = sys.modules.pop("djsite.tether_app", None)
    if module is not None:
        module.app.close_sync()


def test_options_app_names_the_projects_own_app(
    site_app_module: str, rds: redis.Redis, namespace: str
) -> None:
    """OPTIONS {"APP": "module:attribute"} (or a module, whose ``app`` is taken): the backend
    enqueues with that very app, its namespace and its middleware."""
    from django.test.utils import override_settings
    from shop import tasks

    from tether.contrib.django._compat import task_backends

    alias = f"site-{namespace}"  # the backend's apps are cached by alias and options
    backends = {
        alias: {"BACKEND": "tether.contrib.django.TetherBackend",
                "OPTIONS": {"APP": "djsite.tether_app:app"}},
        f"{alias}-module": {"BACKEND": "tether.contrib.django.TetherBackend",
                            "OPTIONS": {"app": "djsite.tether_app"}},
    }  # fmt: skip
    with override_settings(TASKS=backends):
        import djsite.tether_app

        for name in backends:
            assert task_backends[name].tether is djsite.tether_app.app
        result = tasks.add.using(backend=alias).enqueue(2, 3)
    stream = QueueKeys.of(site_app_module, "default").stream("normal")
    ((_, fields),) = rds.xrange(stream)
    envelope = json.loads(fields[b"m"])
    assert envelope["task"] == "shop.tasks.add" and envelope["args"] == [2, 3]
    assert envelope["hdr"] == {"site": "djsite"}  # the app's middleware ran
    assert result.id.startswith("default:2-")
    assert not list(rds.scan_iter(f"{{{namespace}:*"))  # nothing in the settings' namespace


def test_bad_options_app_is_improperly_configured(site_app_module: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from tether.contrib.django import TetherBackend

    cases = {
        "with-url": (
            {"APP": "djsite.tether_app:app", "URL": "redis://x", "namespace": "n"},
            "TASKS['with-url']: OPTIONS give APP, so the app's own settings apply; "
            "remove NAMESPACE, URL",
        ),
        "missing": (
            {"APP": "djsite.nowhere:app"},
            "TASKS['missing']: OPTIONS APP='djsite.nowhere:app' cannot be imported: No module",
        ),
        "no-attribute": (
            {"APP": "djsite.tether_app:nothing"},
            "TASKS['no-attribute']: OPTIONS APP='djsite.tether_app:nothing' cannot be imported",
        ),
        "not-an-app": (
            {"APP": "djsite.tether_app:not_an_app"},
            "TASKS['not-an-app']: OPTIONS APP='djsite.tether_app:not_an_app' is a str, "
            "not a Tether app",
        ),
    }
    for alias, (options, message) in cases.items():
        backend = TetherBackend(alias, {"OPTIONS": options})
        with pytest.raises(ImproperlyConfigured) as caught:
            backend.tether  # noqa: B018 - builds the app
        assert str(caught.value).startswith(message), caught.value
        # `manage.py check` reports the same, before anything runs.
        (error,) = backend.check()
        assert error.id == "tether.E001" and error.msg == str(caught.value)


def test_a_worker_runs_the_projects_own_app(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], rds: redis.Redis
) -> None:
    """With OPTIONS APP, producers and `tether worker tether.contrib.django` both use the
    project's app (here: its own namespace), and every task of the scenario runs."""
    env = {**site_env(), "DJANGO_SETTINGS_MODULE": "djsite.settings_app"}
    worker = django_worker(url, namespace, tmp_path, env=env)
    worker.namespace = f"{namespace}-app"  # the app's namespace, where its lease is
    workers.append(worker)
    worker.wait_ready(rds)
    out = run_scenario(sys.executable, url, namespace, env)
    check_scenario(out, worker.pid)
    assert not list(rds.scan_iter(f"{{{namespace}:*"))


def test_a_task_the_worker_cannot_import_is_dead_lettered(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], rds: redis.Redis
) -> None:
    """An entry naming a Django task the worker cannot import, a module outside the
    project, or a function that is not a task goes to the dead letters with the reason; the
    worker imports nothing outside the project for it."""
    app = Tether(url, namespace=namespace)
    names = {
        "shop.tasks.vanished": "cannot import Django task 'shop.tasks.vanished'",
        "shop.gone.task": "No module named 'shop.gone'",
        "outsider.job": "outside the project",
        "shop.tasks.not_a_task": "is a function, not a Django task",
    }
    for name in names:
        app.enqueue_by_name_sync(name)
    ok = app.enqueue_by_name_sync("shop.tasks.add", 1, 2)
    mark = tmp_path / "imported"
    worker = django_worker(url, namespace, tmp_path, env={**site_env(), "OUTSIDER_MARK": str(mark)})
    workers.append(worker)
    worker.wait_ready(rds)
    assert ok.result_sync(timeout=20) == 3
    keys = QueueKeys.of(namespace, "default")
    wait_until(lambda: rds.xlen(keys.dead) == len(names), timeout=20)
    reasons = {}
    for _, fields in rds.xrange(keys.dead):
        entry = {k.decode(): v.decode() for k, v in fields.items()}
        reasons[json.loads(entry["m"])["task"]] = entry["reason"]
    for name, reason in names.items():
        assert reason in reasons[name], reasons
    assert not mark.exists()  # the worker never imported the module outside the project
    app.close_sync()


def test_the_worker_needs_django_settings(tmp_path: Path, url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether", "worker", "tether.contrib.django", "--burst"],
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        | {"TETHER_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "set DJANGO_SETTINGS_MODULE" in done.stderr


# -- Django 6, in a Python 3.12 venv ------------------------------------------------------


def newer_python() -> str:
    """A Python 3.12 or later (Django 6 needs it): ``DJANGO6_PYTHON`` (``scripts/test`` finds
    one), pyenv's, else one on PATH that runs (a pyenv shim on PATH may not)."""
    candidates = [os.environ["DJANGO6_PYTHON"]] if os.environ.get("DJANGO6_PYTHON") else []
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    candidates += [p for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p]
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    raise AssertionError(f"Django 6 needs Python 3.12 or later; none runs here ({candidates})")


DJANGO6 = "django>=6.0,<6.1"
"""Django 6.0: the conformance tier (test_django_conformance.py) holds the outcomes of its
own tests, so moving on to 6.1 is a change of this pin and of those outcomes together."""


def django6_venv() -> Path:
    """A venv with Django 6.0 and Tether's dependencies (Tether itself from src/ by
    PYTHONPATH), built at first use in about 15 s and kept beside the running venv until the
    requirements change."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], DJANGO6]
    python = newer_python()
    stamp = "\n".join([python, *requirements])
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    base = Path(sys.prefix) / f"tether-django6-{digest}"

    def build() -> None:
        subprocess.run([python, "-m", "venv", str(base)], check=True, timeout=120)
        subprocess.run(
            [str(base / "bin" / "python"), "-m", "pip", "install", "-q", *requirements],
            check=True,
            timeout=300,
        )

    built_once(base, Path(sys.prefix) / "tether-django6.lock", build, stamp)
    return base / "bin" / "python"


def built_once(base: Path, lock_path: Path, build: Callable[[], None], stamp: str) -> None:
    """``base``, made by ``build`` at first use and marked ready (its file holds ``stamp``).
    Parallel test processes build it once: the others wait on the lock, then find it ready;
    a build cut short leaves no mark and starts again from nothing."""
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "ready").exists():
            shutil.rmtree(base, ignore_errors=True)
            build()
            (base / "ready").write_text(stamp)


def test_django_6_runs_the_same_project(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], rds: redis.Redis
) -> None:
    python = str(django6_venv())
    env = site_env(extra_path=str(ROOT / "src"))
    worker = django_worker(url, namespace, tmp_path, python=python, env=env)
    workers.append(worker)
    worker.wait_ready(rds)
    out = run_scenario(python, url, namespace, env)
    assert out["backport"] is False and out["django"].startswith("6.")
    assert out["python"][0] == 3 and out["python"][1] >= 12
    check_scenario(out, worker.pid)
    check_logged_once(worker.log(), "django.tasks")
