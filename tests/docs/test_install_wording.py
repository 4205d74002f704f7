"""How the docs tell a user to install Tether, which is not on PyPI yet.

`pip install 'tether-queue[web]'` and `tether-queue>=0.1` read as if the package were on
PyPI; they install nothing (or someone else's package). The README's *Installing* section
says how to install it today (pip's git support, a clone, a built wheel), and every other
page that names an install points there. The commands themselves are run by
tests/system/test_package_build.py (the wheel `python -m build` makes, installed into a
fresh venv; the git form resolved by pip).
"""

from __future__ import annotations

import re

from tether import __version__

from ..helpers import ROOT

# A PyPI-style requirement of Tether: `pip install tether-queue`, `pip install
# 'tether-queue[web]'`, `tether-queue>=0.1`; a direct reference (`tether-queue[web] @ git+...`)
# is not one.
PYPI_STYLE = re.compile(
    r"pip install ['\"]?tether-queue(\[[\w,]+\])?['\"]?(?!\s*@)(?![\w\[-])"
    r"|tether-queue(\[[\w,]+\])?\s*(>=|==|~=|<)"
)

# Pages another change owns, that still say it the PyPI way (issue 27, part 2, item 7): at
# most this many times each. Lower the count (or drop the entry) as they are fixed.
NOT_YET_FIXED = {"producers.md": 2}


def _pages() -> dict[str, str]:
    pages = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        name = path.relative_to(ROOT / "docs").as_posix()
        if name != "changelog.md":  # the history says what was true then
            pages[name] = path.read_text()
    return pages


def _installing_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Installing\n")
    return readme[start : readme.index("\n## ", start + 1)]


def test_the_readme_says_it_is_not_on_pypi_and_how_to_install_it_today() -> None:
    section = _installing_section()
    flat = " ".join(section.split())
    assert "it is **not on PyPI yet**: `pip install tether-queue` does not install it" in flat
    # pip's git support, a clone, a wheel built by `python -m build` (the name it produces)
    wheel = f"tether_queue-{__version__}-py3-none-any.whl"
    for line in [
        "pip install 'tether-queue[web,metrics] @ git+https://<repository-url>@<tag-or-commit>'",
        "pip install './tether[web,metrics]'",
        f"python -m build      # dist/{wheel} and dist/tether_queue-{__version__}.tar.gz",
        f"pip install './dist/{wheel}[web,metrics]'",
    ]:
        assert line in section.splitlines(), line
    # and how a project's pyproject.toml depends on it
    assert '`"tether-queue[web] @ git+https://<repository-url>@<tag-or-commit>"`' in flat
    assert f'`"tether-queue[web] @ file:///absolute/path/to/{wheel}"`' in flat
    assert "tests/system/test_package_build.py" in flat


def test_no_page_installs_it_as_if_it_were_on_pypi() -> None:
    installing = _installing_section()
    found: dict[str, int] = {}
    for name, text in _pages().items():
        said = text.replace(installing, "") if name == "README.md" else text
        hits = PYPI_STYLE.findall(said)
        if hits:
            found[name] = len(hits)
    over = {name: count for name, count in found.items() if count > NOT_YET_FIXED.get(name, 0)}
    assert not over, f"PyPI-style installs of tether-queue: {over}"


def test_the_pattern_tells_a_pypi_install_from_a_direct_reference() -> None:
    for pypi in [
        "pip install 'tether-queue[web]'",
        "pip install tether-queue",
        'pip install "tether-queue[metrics,otel]"',
        "`tether-queue>=0.1` in `pyproject.toml`",
    ]:
        assert PYPI_STYLE.search(pypi), pypi
    for direct in [
        "pip install 'tether-queue[web] @ git+https://<repository-url>@<tag-or-commit>'",
        "pip install 'tether-queue @ git+https://host/tether.git@v0.1.0'",
        "pip install tether-queue-extras",
        "the distribution is named `tether-queue`",
    ]:
        assert not PYPI_STYLE.search(direct), direct


def test_a_page_that_names_an_install_links_to_the_readmes_section() -> None:
    for name, text in _pages().items():
        if name == "README.md" or "<repository-url>" not in text:
            continue
        depth = name.count("/")
        link = "../" * (depth + 1) + "README.md#installing"
        assert f"]({link})" in text, name
