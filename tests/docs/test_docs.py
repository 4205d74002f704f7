"""Every Python example in README.md and docs/ (subfolders too) runs, against the test server.

A block preceded by `<!-- not-runnable -->` is a fragment: it is not run, but it must compile
(top-level ``await`` allowed), so a syntax error in it fails. A block preceded by
`<!-- output: TEXT -->` must print TEXT; a block preceded by `<!-- pytest: TEXT -->` is a test
module, run by pytest (with the tether plugin, on the test server), whose summary must say TEXT
(for example `3 passed`).

The examples in the docstrings that the API reference pages show (the modules named by their
``::: module`` lines, and every public class, function and method in them) are fragments too:
each literal block (after a line ending in ``::``), fenced block and doctest must compile. A
block that is not Python goes in a ``.. code-block:: <language>`` directive, which is skipped.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..helpers import ROOT

# A marker is the HTML comment on the line before the block; it may hold ">" (an expected
# output such as "a -> b"), so it ends at the first "-->" of its line.
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^\n]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)
MARKER_KINDS = ("output:", "pytest:", "not-runnable")


def blocks() -> Iterator[tuple[str, str, str]]:
    """(where, marker, code) of every Python block of README.md and docs/."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        name = path.relative_to(ROOT / "docs") if path.parent != ROOT else path.name
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            marker = (match.group("marker") or "").strip()
            yield f"{name}#{i + 1}", marker, match.group("code")


def examples() -> list[tuple[str, str, str]]:
    out = []
    for where, marker, code in blocks():
        if marker == "not-runnable":
            continue
        expected = marker.removeprefix("output:").strip() if marker.startswith("output:") else ""
        if marker.startswith("pytest:"):
            expected = marker  # run by pytest; the summary must say what follows
        out.append((where, code, expected))
    return out


def test_every_marker_is_one_the_runner_reads() -> None:
    """A marker the runner does not know would let its block run unchecked."""
    unknown = [
        (where, marker)
        for where, marker, _ in blocks()
        if marker and not marker.startswith(MARKER_KINDS)
    ]
    assert not unknown


def fragments() -> list[tuple[str, str]]:
    return [(where, code) for where, marker, code in blocks() if marker == "not-runnable"]


def must_compile(code: str, where: str) -> None:
    compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


@pytest.mark.parametrize(("where", "code", "expected"), examples(), ids=[e[0] for e in examples()])
def test_example_runs(
    url: str, namespace: str, tmp_path: Path, where: str, code: str, expected: str
) -> None:
    env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace, "PYTHONPATH": str(ROOT)}
    if expected.startswith("pytest:"):
        expected = expected.removeprefix("pytest:").strip()
        (tmp_path / "test_example.py").write_text(code)
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_example.py",
        ]
        env["TETHER_TEST_URL"] = url  # the plugin's tether_server: the test server
    else:
        (tmp_path / "example.py").write_text(code)
        command = [sys.executable, "example.py"]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"
    if expected:
        assert expected in done.stdout, f"{where} printed:\n{done.stdout}"


@pytest.mark.parametrize(("where", "code"), fragments(), ids=[f[0] for f in fragments()])
def test_fragment_compiles(where: str, code: str) -> None:
    must_compile(code, where)


# -- the docstrings the API reference shows ---------------------------------------------------


def reference_modules() -> list[str]:
    names: list[str] = []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        names += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M)
    return names


def _public(module: Any) -> Iterator[tuple[str, Any]]:
    """The public objects of a module the reference renders: ``__all__``, else what the
    module defines; with the public methods and properties of each class."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            k
            for k, v in vars(module).items()
            if not k.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    for name in names:
        obj = getattr(module, name)
        yield f"{module.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                member = value
                if isinstance(value, (staticmethod, classmethod)):
                    member = value.__func__
                elif isinstance(value, property):
                    member = value.fget
                yield f"{module.__name__}.{name}.{attr}", member


def docstring_blocks(doc: str) -> Iterator[str]:
    """The code of a docstring: literal blocks (after a line ending in ``::`` that is not a
    directive), fenced blocks, and doctests (``>>>`` and ``...`` lines)."""
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert end is not None, f"an unclosed fence in:\n{doc}"
            if stripped in ("```", "```python", "```py"):
                yield textwrap.dedent("\n".join(lines[i + 1 : end]))
            i = end + 1
            continue
        if stripped.startswith(">>> "):
            code = []
            while i < len(lines) and lines[i].strip().startswith((">>> ", "... ", ">>>", "...")):
                code.append(lines[i].strip()[4:])
                i += 1
            yield "\n".join(code)
            continue
        if stripped.endswith("::") and not stripped.startswith(".. "):
            indent = len(line) - len(line.lstrip())
            body: list[str] = []
            j = i + 1
            while j < len(lines) and (
                not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
            ):
                body.append(lines[j])
                j += 1
            yield textwrap.dedent("\n".join(body)).strip("\n") + "\n"
            i = j
            continue
        i += 1


def _ours(obj: Any) -> bool:
    """A module, class or function of Tether's (whose docstring the reference renders)."""
    if inspect.ismodule(obj):
        return obj.__name__.startswith("tether")
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return str(getattr(obj, "__module__", "")).startswith("tether")
    return False


def docstring_examples() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen: set[int] = set()
    for module_name in reference_modules():
        module = importlib.import_module(module_name)
        for name, obj in [(module_name, module), *_public(module)]:
            if not _ours(obj) or id(obj) in seen:
                continue  # a constant or a field has its type's docstring, not its own
            seen.add(id(obj))
            doc = inspect.getdoc(obj)
            for n, code in enumerate(docstring_blocks(doc or ""), 1):
                out.append((f"{name}#{n}", code))
    return out


def test_the_docstring_examples_the_reference_shows_compile() -> None:
    found = docstring_examples()
    names = {where.split("#")[0] for where, _ in found}
    # The reader finds them (tether.contrib.django's settings, taskiq's switch, ...).
    assert {"tether.contrib.django", "tether.contrib.taskiq"} <= names, names
    failures = []
    for where, code in found:
        try:
            must_compile(code, where)
        except SyntaxError as exc:
            failures.append(f"{where}: {exc}\n{code}")
    assert not failures, "\n\n".join(failures)


def test_the_docstring_reader_finds_each_kind_of_block() -> None:
    doc = textwrap.dedent(
        """
        Text, then a literal block::

            x = 1
            if x:
                y = 2

        .. warning::
           Prose in a directive, with an example::

               call(a,
                    b=1)

        >>> total = 1 +  \\
        ...     2

        ```python
        await thing()
        ```

        .. code-block:: sh

            tether worker app
        """
    )
    assert list(docstring_blocks(doc)) == [
        "x = 1\nif x:\n    y = 2\n",
        "call(a,\n     b=1)\n",
        "total = 1 +  \\\n    2",
        "await thing()",
    ]
    with pytest.raises(SyntaxError):
        must_compile("def broken(:\n    pass\n", "broken")
