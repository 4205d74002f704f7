"""What a second new user tripped over in the docs (issue 27, part 2, item 9), each checked.

- The `docs` extra lacked ruff, which mkdocstrings uses to format the signatures it shows
  (without Black or ruff it prints "Formatting signatures requires either Black or Ruff").
- An in-process FastAPI worker under uvicorn printed none of Tether's INFO lines: the Logs
  section of docs/observability.md says why and how; its example (run by test_docs.py, with
  the start line as its expected output) serves a FastAPI app with uvicorn and shows them.
- The Celery guide had no row for Celery's `rate_limit`.
- docs/taskiq.md did not say that results still need a taskiq result backend.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess

from ..helpers import ROOT

DOCS = ROOT / "docs"


def _flat(page: str) -> str:
    return " ".join((DOCS / page).read_text().split())


def _extra(name: str) -> set[str]:
    """The requirement names of one extra, from the installed package's metadata."""
    names = set()
    for requirement in importlib.metadata.requires("tether-queue") or []:
        if re.search(rf"extra\s*==\s*['\"]{name}['\"]", requirement):
            names.add(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower())
    return names


def test_the_docs_extra_brings_ruff_for_mkdocstrings_signatures() -> None:
    docs = _extra("docs")
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "ruff"} <= docs, docs
    # and what mkdocstrings looks for is there: ruff's binary, which formats a signature
    from ruff.__main__ import find_ruff_bin

    formatted = subprocess.run(
        [find_ruff_bin(), "format", "--stdin-filename", "file.py", "-"],
        input="def f(a,b = 1)->int: ...\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert formatted == "def f(a, b=1) -> int: ...\n"


def test_the_observability_page_says_how_to_see_tethers_logs_under_uvicorn() -> None:
    text = _flat("observability.md")
    assert "## Logs" in text
    assert (
        "**An in-process worker under uvicorn** (`lifespan(app, worker=True)` of "
        "`tether.contrib.fastapi`) prints none of Tether's INFO lines by default" in text
    )
    assert "<!-- output: INFO tether.worker: worker api-1 serving queues default -->" in text
    assert 'tether_log = logging.getLogger("tether")' in text
    assert '"loggers": {"tether": {"handlers": ["default"], "level": "INFO"}}' in text


def test_the_celery_guide_maps_rate_limit_to_flow_control() -> None:
    rows = [
        line
        for line in (DOCS / "migrate" / "celery.md").read_text().splitlines()
        if line.startswith("| `rate_limit=") or line.startswith("| `app.control.rate_limit(")
    ]
    assert len(rows) == 2, rows
    declared, runtime = rows
    assert "per worker instance" in declared
    assert "across all workers of the queue together, not per worker" in declared
    assert "[Flow control](../flow-control.md)" in declared
    assert '`await app.limits.set("shop.send", rate_limit="10/m")`' in runtime


def test_the_taskiq_page_says_results_need_a_taskiq_result_backend() -> None:
    text = _flat("taskiq.md")
    assert "**Results still need a taskiq result backend.**" in text
    assert "taskiq's default `DummyResultBackend` keeps nothing" in text
    assert ".with_result_backend(" in text
