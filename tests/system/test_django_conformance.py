"""Django's own task tests on Tether: the conformance tier of the Django backend.

Django 6.0's ``tests/tasks`` (``test_tasks``, ``test_dummy_backend``,
``test_immediate_backend``: the tests of the framework and of its two built-in backends) run
unchanged against :class:`~tether.contrib.django.TetherBackend` on this session's server. The
test modules come from Django's source distribution, downloaded from the package index at
first use and kept beside the Django 6 venv; nothing of them is in this repository. The one
change is the ``TASKS`` setting (tests/django_site/conformance/run.py): the dummy and the
immediate backends become Tether's, plus a test-only ``clear()`` that Django's tests call
before each test.

No worker runs: none of these tests waits for one (the immediate backend runs a task inside
``enqueue()``, the dummy one never runs it), so a worker would change no outcome, only make
``test_get_result`` race it (the task could start between the two reads it compares).

Every test passes but those listed in ``DIFFERENCES``, each with its reason and a part of
the failure it shows. The comparison is strict both ways: a listed test that passes (a gap
closed) and an unlisted test that fails (a new gap) both fail this test, as does a listed
test that fails in another way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..helpers import ROOT
from .test_django import built_once, django6_venv

RUNNER = ROOT / "tests" / "django_site" / "conformance" / "run.py"
LABELS = ("tasks.test_tasks", "tasks.test_dummy_backend", "tasks.test_immediate_backend")


@dataclass(frozen=True)
class Difference:
    why: str
    shows: str
    """A part of the failure line the runner reports: the test fails for this reason."""


# -- why a test of Django's does not pass on Tether ----------------------------------------

DUMMY_RESULTS = (
    "reads the dummy backend's own list of results (DummyBackend.results), which no other "
    "backend has"
)
DUMMY_CLASS = "checks that the backend is Django's dummy backend (its class)"
IMMEDIATE_CLASS = "checks that the backend is Django's immediate backend (its class, no options)"
IMMEDIATE_RUNS = (
    "the immediate backend runs the task inside enqueue(), so the result enqueue() returns "
    "has finished (and its logs were written); on Tether a worker runs it later, and "
    "enqueue() returns a READY result"
)
IMMEDIATE_LIMIT = (
    "checks what the immediate backend cannot do (get_result, refresh, run_after): Tether does them"
)
IMMEDIATE_INTERRUPT = (
    "the immediate backend lets a task's KeyboardInterrupt out of enqueue(); on Tether the "
    "task runs on a worker, where it fails the task (FAILED, KeyboardInterrupt) and the worker "
    "serves on (tests/system/test_django.py)"
)
ARGUMENT_MESSAGE = (
    "an argument JSON cannot encode raises a TypeError as in Django, "
    "tether.ArgumentSerializationError, whose message names the argument and the serializer "
    "rather than Django's 'Unsupported type'"
)
BLOCKING_ON_A_LOOP = (
    "calls the blocking refresh() from an async test, on the event loop's thread: Tether "
    "refuses blocking calls there (BlockingCallError) rather than stall the loop; "
    "await result.arefresh() works"
)

NOT_SUCCESSFUL = "TaskResultStatus.READY != TaskResultStatus.SUCCESSFUL"
NO_RESULTS = "no attribute 'results'"
NOT_AN_INSTANCE = "is not an instance of"
NO_ERROR_LOG = "no logs of level ERROR or higher triggered"
NO_LOG = "no logs of level INFO or higher triggered"

_TASKS = "tasks.test_tasks.TaskTestCase"
_DUMMY = "tasks.test_dummy_backend.DummyBackendTestCase"
_IMMEDIATE = "tasks.test_immediate_backend.ImmediateBackendTestCase"

DIFFERENCES: dict[str, Difference] = {
    # test_tasks: the framework's tests, on the dummy backend (and the immediate one)
    f"{_TASKS}.test_using_correct_backend": Difference(DUMMY_CLASS, NOT_AN_INSTANCE),
    f"{_TASKS}.test_get_backend": Difference(DUMMY_CLASS, NOT_AN_INSTANCE),
    f"{_TASKS}.test_enqueue_task": Difference(DUMMY_RESULTS, NO_RESULTS),
    f"{_TASKS}.test_enqueue_task_async": Difference(DUMMY_RESULTS, NO_RESULTS),
    f"{_TASKS}.test_enqueue_with_invalid_argument": Difference(
        ARGUMENT_MESSAGE, "'Unsupported type' not found in \"task 'tasks.tasks.noop_task'"
    ),
    f"{_TASKS}.test_aenqueue_with_invalid_argument": Difference(
        ARGUMENT_MESSAGE, "'Unsupported type' not found in \"task 'tasks.tasks.noop_task'"
    ),
    f"{_TASKS}.test_refresh_result": Difference(BLOCKING_ON_A_LOOP, "BlockingCallError"),
    f"{_TASKS}.test_task_error_invalid_exception": Difference(IMMEDIATE_RUNS, NO_LOG),
    f"{_TASKS}.test_task_error_unknown_module": Difference(IMMEDIATE_RUNS, NO_LOG),
    # test_dummy_backend
    f"{_DUMMY}.test_using_correct_backend": Difference(DUMMY_CLASS, NOT_AN_INSTANCE),
    f"{_DUMMY}.test_enqueue_task": Difference(DUMMY_RESULTS, NO_RESULTS),
    f"{_DUMMY}.test_enqueue_task_async": Difference(DUMMY_RESULTS, NO_RESULTS),
    f"{_DUMMY}.test_refresh_result": Difference(DUMMY_RESULTS, NO_RESULTS),
    f"{_DUMMY}.test_refresh_result_async": Difference(DUMMY_RESULTS, NO_RESULTS),
    "tasks.test_dummy_backend.DummyBackendTransactionTestCase."
    "test_doesnt_wait_until_transaction_commit_by_default": Difference(DUMMY_RESULTS, NO_RESULTS),
    # test_immediate_backend
    f"{_IMMEDIATE}.test_using_correct_backend": Difference(IMMEDIATE_CLASS, NOT_AN_INSTANCE),
    f"{_IMMEDIATE}.test_cannot_get_result": Difference(
        IMMEDIATE_LIMIT, "TaskResultDoesNotExist: '123' is not a Tether task id"
    ),
    f"{_IMMEDIATE}.test_cannot_refresh_result": Difference(
        IMMEDIATE_LIMIT, "NotImplementedError not raised"
    ),
    f"{_IMMEDIATE}.test_cannot_pass_run_after": Difference(
        IMMEDIATE_LIMIT, "InvalidTask not raised"
    ),
    f"{_IMMEDIATE}.test_enqueue_task": Difference(IMMEDIATE_RUNS, NOT_SUCCESSFUL),
    f"{_IMMEDIATE}.test_enqueue_task_async": Difference(IMMEDIATE_RUNS, NOT_SUCCESSFUL),
    f"{_IMMEDIATE}.test_result": Difference(IMMEDIATE_RUNS, NOT_SUCCESSFUL),
    f"{_IMMEDIATE}.test_result_async": Difference(IMMEDIATE_RUNS, NOT_SUCCESSFUL),
    f"{_IMMEDIATE}.test_context": Difference(IMMEDIATE_RUNS, NOT_SUCCESSFUL),
    f"{_IMMEDIATE}.test_successful_task_no_none_in_logs": Difference(
        IMMEDIATE_RUNS, NOT_SUCCESSFUL
    ),
    f"{_IMMEDIATE}.test_takes_context": Difference(IMMEDIATE_RUNS, "Task has not finished yet"),
    f"{_IMMEDIATE}.test_catches_exception": Difference(IMMEDIATE_RUNS, "AssertionError: 0 != 1"),
    f"{_IMMEDIATE}.test_complex_exception": Difference(IMMEDIATE_RUNS, NO_ERROR_LOG),
    f"{_IMMEDIATE}.test_complex_return_value": Difference(IMMEDIATE_RUNS, NO_ERROR_LOG),
    f"{_IMMEDIATE}.test_enqueue_logs": Difference(IMMEDIATE_RUNS, "AssertionError: 1 != 3"),
    f"{_IMMEDIATE}.test_failed_logs": Difference(IMMEDIATE_RUNS, "AssertionError: 1 != 3"),
    f"{_IMMEDIATE}.test_throws_keyboard_interrupt": Difference(
        IMMEDIATE_INTERRUPT, "KeyboardInterrupt not raised"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTransactionTestCase."
    "test_doesnt_wait_until_transaction_commit_by_default": Difference(
        IMMEDIATE_RUNS, NOT_SUCCESSFUL
    ),
}
"""Django 6.0's task tests that do not pass on Tether, by test id."""

TOTAL = 71
"""How many tests the three modules of Django 6.0 hold."""


def test_djangos_own_task_tests_pass_but_the_listed_differences(url: str, namespace: str) -> None:
    python = django6_venv()
    outcomes = run_djangos_tests(python, django_tests(python), url, namespace)
    mismatches = compare(outcomes, DIFFERENCES)
    passed = sum(outcome == "passed" for outcome in outcomes.values())
    assert not mismatches, (
        f"{passed} of {len(outcomes)} of Django's task tests pass on Tether; "
        "these differ from the list of known differences:\n" + "\n".join(mismatches)
    )
    assert len(outcomes) == TOTAL


def test_the_docs_give_the_figures_of_this_list() -> None:
    """docs/producers.md quotes how many of Django's tests pass, and how many differ for each
    reason: the figures of this list, not of an earlier one."""
    text = (ROOT / "docs" / "producers.md").read_text()
    assert f"**{TOTAL - len(DIFFERENCES)} of the {TOTAL} pass**" in text
    assert f"Each of the other {len(DIFFERENCES)} is listed" in text
    table = text[text.index("| Tests | Why they do not pass on Tether |") :].split("\n\n")[0]
    counts = [int(row.split("|")[1]) for row in table.splitlines()[2:]]
    assert sum(counts) == len(DIFFERENCES), table


def compare(outcomes: dict[str, str], differences: dict[str, Difference]) -> list[str]:
    """What does not match the list, one line each, in both directions."""
    mismatches = []
    for test_id, outcome in sorted(outcomes.items()):
        known = differences.get(test_id)
        if known is None:
            if outcome != "passed":
                mismatches.append(f"{test_id}: {outcome} (not a known difference)")
        elif outcome == "passed":
            mismatches.append(f"{test_id}: passes now; take it off the list ({known.why})")
        elif known.shows not in outcome:
            mismatches.append(
                f"{test_id}: {outcome} (listed as failing with {known.shows!r}: {known.why})"
            )
    mismatches += [
        f"{test_id}: listed, but Django's tests have no such test"
        for test_id in sorted(set(differences) - set(outcomes))
    ]
    return mismatches


def run_djangos_tests(python: Path, tests_dir: Path, url: str, namespace: str) -> dict[str, str]:
    """Each test's outcome, from Django's own runner in the Django 6 venv."""
    done = subprocess.run(
        [str(python), str(RUNNER), str(tests_dir), *LABELS],
        env={
            **os.environ,
            "TETHER_URL": url,
            "TETHER_NAMESPACE": namespace,
            "PYTHONPATH": str(ROOT / "src"),
        },
        cwd=tests_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), done.stdout + done.stderr
    return dict(json.loads(lines[-1]))


def django_tests(python: Path) -> Path:
    """The ``tests`` folder of Django's source distribution, of the version ``python``'s
    venv runs, with ``tasks`` alone in it: downloaded from the package index at first use
    (about 10 s) and kept beside that venv."""
    version = subprocess.run(
        [str(python), "-c", "import django; print(django.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    venv = python.parent.parent
    base = venv / f"django-{version}-tests"

    def build() -> None:
        download = base / "sdist"
        subprocess.run(
            [str(python), "-m", "pip", "download", "-q", "--no-binary", ":all:",
             "--no-deps", f"django=={version}", "-d", str(download)],
            check=True,
            timeout=300,
        )  # fmt: skip
        (sdist,) = download.glob("*.tar.gz")
        extract_folder(sdist, PurePosixPath("tests", "tasks"), base / "tests" / "tasks")
        shutil.rmtree(download)

    built_once(base, venv / "django-tests.lock", build, version)
    return base / "tests"


def extract_folder(sdist: Path, folder: PurePosixPath, target: Path) -> None:
    """The files under ``folder`` of the archive's top directory, and nothing else."""
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = PurePosixPath(member.name).parts
            inside = parts[1 : 1 + len(folder.parts)] == folder.parts
            if not (member.isfile() and inside) or ".." in parts:
                continue
            path = target.joinpath(*parts[1 + len(folder.parts) :])
            path.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            path.write_bytes(source.read())
