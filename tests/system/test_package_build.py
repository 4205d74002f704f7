"""The package as a user installs it today: `python -m build`, then the wheel in a fresh venv.

Tether is not on PyPI yet; the docs tell users to install it from the repository (pip's git
support, which builds it the same way) or from a wheel built with `python -m build`. This
test builds the sdist and, from the sdist, the wheel (what `python -m build` does with no
flags), checks that both carry every file of the package (the sources, py.typed, the Lua
scripts, the dashboard's templates and static files), installs the wheel with its
dependencies into a fresh virtual environment that sees nothing of this one (the same index
and pip configuration as the suite's own environment), and runs the installed `tether`:
its version, an import, and a task enqueued and run by `tether worker --burst` on the
suite's server. Then the sdist installs over it, and answers again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

from tether import __version__

from ..helpers import ROOT

PACKAGE = ROOT / "src" / "tether"


def _package_files() -> set[str]:
    """Every file of the package in the work tree, relative to src/ (bytecode left out)."""
    return {
        path.relative_to(ROOT / "src").as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def _run(
    command: list[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=cwd,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _installed(python: Path, env: dict[str, str], cwd: Path) -> set[str]:
    """The files of the tether package installed in the venv of ``python``, as in src/."""
    listing = _run(
        [
            python,
            "-c",
            "import pathlib, tether; root = pathlib.Path(tether.__file__).parent; "
            "print('\\n'.join(p.relative_to(root.parent).as_posix() "
            "for p in root.rglob('*') if p.is_file()))",
        ],
        env=env,
        cwd=cwd,
    ).stdout
    return {line for line in listing.splitlines() if "__pycache__" not in line}


def test_the_built_wheel_and_sdist_install_and_run_a_task(
    tmp_path: Path, url: str, namespace: str
) -> None:
    expected = _package_files()
    kinds = {Path(name).suffix for name in expected}
    assert {".py", ".lua", ".html", ".css", ".js", ".svg"} <= kinds, kinds
    assert "tether/py.typed" in expected

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, ROOT])
    [wheel] = dist.glob("tether_queue-*.whl")
    [sdist] = dist.glob("tether_queue-*.tar.gz")
    assert wheel.name == f"tether_queue-{__version__}-py3-none-any.whl"
    assert sdist.name == f"tether_queue-{__version__}.tar.gz"

    # The sdist holds the sources under src/, with everything the package reads at run time.
    with tarfile.open(sdist) as archive:
        prefix = f"tether_queue-{__version__}/"
        in_sdist = {name.removeprefix(prefix) for name in archive.getnames()}
    missing = {f"src/{name}" for name in expected} - in_sdist
    assert not missing, f"not in the sdist: {sorted(missing)}"
    assert {"pyproject.toml", "README.md"} <= in_sdist

    # The wheel (built from the sdist) holds the same files, and the console script.
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        entry_points = archive.read(f"tether_queue-{__version__}.dist-info/entry_points.txt")
    missing = expected - in_wheel
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "tether = tether.cli:main" in entry_points.decode()

    # A fresh venv that sees nothing of this one; pip (this venv's) installs into it with
    # the dependencies, from the index the suite's own environment came from.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TETHER_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q"]
    _run([*pip, wheel], env=env, cwd=tmp_path)

    where = _run(
        [python, "-c", "import tether, sys; print(tether.__file__); print(sys.prefix)"],
        env=env,
        cwd=tmp_path,
    ).stdout.split()
    assert where[0].startswith(str(venv)), where  # the installed copy, not src/
    assert where[1] == str(venv)
    assert _installed(python, env, tmp_path) >= expected
    version = _run([venv / "bin" / "tether", "--version"], env=env, cwd=tmp_path).stdout
    assert __version__ in version

    # A task enqueued by the installed package and run by its `tether worker`.
    (tmp_path / "smoke_app.py").write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from tether import Tether

            app = Tether({url!r}, namespace={namespace!r})


            @app.task
            async def add(x: int, y: int) -> int:
                return x + y


            if __name__ == "__main__":
                if sys.argv[1] == "enqueue":
                    print(add.enqueue_sync(2, 3).id)
                else:
                    handle = app.handle(sys.argv[2])
                    print(json.dumps(handle.result_sync(timeout=10)))
            """
        )
    )
    task_id = _run([python, "smoke_app.py", "enqueue"], env=env, cwd=tmp_path).stdout.strip()
    _run(
        [venv / "bin" / "tether", "worker", "smoke_app:app", "--burst", "--no-scheduler"],
        env={**env, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
    )
    result = _run([python, "smoke_app.py", "result", task_id], env=env, cwd=tmp_path).stdout
    assert json.loads(result) == 5

    # The sdist installs too (pip builds it with the backend of pyproject.toml).
    _run([*pip, "--no-deps", "--force-reinstall", sdist], env=env, cwd=tmp_path)
    version = _run([venv / "bin" / "tether", "--version"], env=env, cwd=tmp_path).stdout
    assert __version__ in version
    assert _installed(python, env, tmp_path) >= expected


def test_pips_git_support_resolves_it_from_the_repository(tmp_path: Path) -> None:
    """The README's first way to install: `tether-queue[...] @ git+<url>@<commit>`. Here the
    repository is this clone (its committed HEAD); pip clones it, builds its metadata and
    resolves the distribution with the extra."""
    commit = _run(["git", "-C", ROOT, "rev-parse", "HEAD"]).stdout.strip()
    report = tmp_path / "report.json"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "-q",
            "--report",
            report,
            f"tether-queue[web] @ git+file://{ROOT}@{commit}",
        ],
        cwd=tmp_path,
    )
    [install] = json.loads(report.read_text())["install"]
    assert install["metadata"]["name"] == "tether-queue"
    assert install["metadata"]["version"] == __version__
    assert install["requested_extras"] == ["web"]
    assert install["download_info"]["vcs_info"]["commit_id"] == commit
