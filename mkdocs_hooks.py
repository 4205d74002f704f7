"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

Pages in docs/ link to two files outside it, so that the links work on GitHub: the README
(`../README.md`) and the benchmark guide (`../bench/README.md`). On the site those files are
pages that include them (index.md and benchmarks.md), so a link to either file is pointed at
its page, anchor kept. Every other link is left to the strict build's checks.

Text between `<!-- github-only -->` and `<!-- /github-only -->` is for readers of docs/ on
GitHub (where an include shows as a bare line) and is left out of the site.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

# A file outside docs/ (relative to the folder that holds docs/) -> the page that includes it.
INCLUDED_BY = {
    "README.md": "index.md",
    "bench/README.md": "benchmarks.md",
}

LINK = re.compile(r"\]\((?P<target>[^)\s#]+\.md)(?P<anchor>#[^)\s]*)?\)")
GITHUB_ONLY = re.compile(r"<!-- github-only -->\n.*?<!-- /github-only -->\n*", re.S)


@event_priority(-100)  # after include-markdown, so included text is rewritten too
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    page_dir = (docs_dir / page.file.src_uri).parent
    included_by = {docs_dir.parent / outside: inside for outside, inside in INCLUDED_BY.items()}

    def point_at_page(match: re.Match[str]) -> str:
        target = match.group("target")
        if "://" in target:
            return match.group(0)
        inside = included_by.get((page_dir / target).resolve())
        if inside is None:
            return match.group(0)
        relative = posixpath.relpath(inside, posixpath.dirname(page.file.src_uri) or ".")
        return f"]({relative}{match.group('anchor') or ''})"

    return LINK.sub(point_at_page, GITHUB_ONLY.sub("", markdown))


# Docstrings use two reStructuredText habits that mkdocstrings' Google-style parser would print
# as they are: Sphinx cross-references (:class:`~tether.TaskFailed`, :meth:`enqueue`) and a
# paragraph ending in "::" before an indented example. This griffe extension (mkdocs.yml names
# it in mkdocstrings' options) turns each role into inline code (`TaskFailed`, `enqueue`) and
# the "::" into ":" (the indented block is a code block in Markdown too). The docstrings
# themselves stay as they are.
ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj):`~?(?P<name>[^`]+)`")
LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.M)


def _plain_roles(text: str) -> str:
    text = ROLE.sub(lambda match: f"`{match.group('name')}`", text)
    return LITERAL_BLOCK.sub(":", text)


try:
    import griffe
except ImportError:  # only the site build needs it, and mkdocstrings brings it
    pass
else:

    class SphinxRolesAsCode(griffe.Extension):
        def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = _plain_roles(obj.docstring.value)
