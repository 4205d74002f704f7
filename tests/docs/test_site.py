"""The documentation site's strict build catches what it should (CI builds the real site).

Each test builds a site from copies of the real pages (the API reference pages without their
``:::`` blocks, so it runs in seconds) with the project's own mkdocs.yml (theme, extensions,
hooks, plugins) and a nav of its own: links to the README and to bench/README.md land on the
pages that include them, from any depth (and the note those pages hold for GitHub readers
stays out of the site), while a broken link, a broken anchor, an unresolved API reference or
a page left out of the nav fails the build, naming it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..helpers import ROOT

FILES = sorted(
    str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*") if path.is_file()
)
PAGES = [page for page in FILES if page.endswith(".md")]
DIRECTIVE = re.compile(r"^::: .*\n(?:[ \t]+.*\n|\n)*", re.M)
"""A mkdocstrings block (``::: module`` and its indented options): left out of the copies."""


def build(
    tmp_path: Path, extra: dict[str, str], nav: list[str]
) -> subprocess.CompletedProcess[str]:
    """Build a site from copies of PAGES plus ``extra`` pages, with the project's mkdocs.yml."""
    root = tmp_path / "project"
    docs = root / "docs"
    docs.mkdir(parents=True)
    (root / "bench").mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copy(ROOT / "bench" / "README.md", root / "bench" / "README.md")
    for page in FILES:  # the pages, and the images and files they link to
        (docs / page).parent.mkdir(parents=True, exist_ok=True)
        if page.startswith("reference/") and page.endswith(".md"):
            (docs / page).write_text(DIRECTIVE.sub("", (ROOT / "docs" / page).read_text()))
        else:
            shutil.copy(ROOT / "docs" / page, docs / page)
    for name, text in extra.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    # The config lives beside the project's, so its relative paths (hooks, src) still hold.
    config = ROOT / f".mkdocs-test-{os.getpid()}-{tmp_path.name}.yml"
    nav_lines = "".join(f"  - {page}\n" for page in nav)
    config.write_text(
        f"INHERIT: mkdocs.yml\ndocs_dir: {docs}\nsite_dir: {root / 'site'}\nnav:\n{nav_lines}"
    )
    try:
        return subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
            check=False,
        )
    finally:
        config.unlink()


def test_links_to_the_readme_and_the_bench_guide_land_on_their_pages(tmp_path: Path) -> None:
    page = (
        "# Deep page\n\n"
        "[quickstart](../../../README.md#quickstart),"
        " [bench](../../../bench/README.md#how-it-measures),"
        " [tasks](../../tasks.md#retries-with-backoff).\n"
    )
    done = build(tmp_path, {"deploy/more/deep.md": page}, [*PAGES, "deploy/more/deep.md"])
    assert done.returncode == 0, done.stdout + done.stderr

    site = tmp_path / "project" / "site"
    html = (site / "deploy" / "more" / "deep" / "index.html").read_text()
    assert 'href="../../../#quickstart"' in html
    assert 'href="../../../benchmarks/#how-it-measures"' in html
    assert 'href="../../../tasks/#retries-with-backoff"' in html
    # The README's own links, included into the home page, point into the site.
    home = (site / "index.html").read_text()
    assert 'href="tasks/"' in home and 'href="benchmarks/"' in home
    # The note for GitHub readers of the pages that only include a file is left out.
    for page, html in (("index.md", home), ("benchmarks.md", site / "benchmarks" / "index.html")):
        assert "<!-- github-only -->" in (ROOT / "docs" / page).read_text()
        text = html if isinstance(html, str) else html.read_text()
        assert "Reading this on GitHub" not in text and "github-only" not in text


def test_broken_links_references_and_pages_left_out_fail_the_build(tmp_path: Path) -> None:
    broken = (
        "# Broken\n\n"
        "[gone](no-such-page.md), [anchor](tasks.md#no-such-section),"
        " [reference][tether.NoSuchName].\n"
    )
    done = build(tmp_path, {"broken.md": broken, "orphan.md": "# Orphan\n"}, [*PAGES, "broken.md"])
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "no-such-page.md" in output
    assert "no-such-section" in output
    assert "tether.NoSuchName" in output
    assert "orphan.md" in output
