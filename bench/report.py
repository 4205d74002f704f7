"""Rounds into figures: median and spread per system, ratios to the best peer and to the
floor, and the markdown table. Standard library only."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

DASH, TIMES, NONE = "\u2013", "\u00d7", "\u2014"  # en dash, multiplication sign, em dash


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    digits: int = 0


FIGURES = [
    Figure("enqueue_rate", "enqueue, one awaited call at a time", "tasks/s", True),
    Figure("enqueue_batch_rate", "enqueue, batched (1,000 per call)", "tasks/s", True),
    Figure("process_rate", "processing rate (ready → last done)", "tasks/s", True),
    Figure("latency_p50_ms", "latency enqueue → start at idle, p50", "ms", False, 2),
    Figure("latency_p99_ms", "latency enqueue → start at idle, p99", "ms", False, 2),
    Figure("worker_cpu_us", "worker CPU per task (user + sys)", "µs", False),
    Figure("process_cmds", "Redis commands per task, processing", "", False, 2),
    Figure("enqueue_cmds", "Redis commands per task, enqueue one at a time", "", False, 2),
    Figure("enqueue_batch_cmds", "Redis commands per task, batched enqueue", "", False, 2),
    Figure("memory_delta_kib", "Redis used_memory, after the run minus before", "KiB", False),
    Figure("server_cpu_us", "Redis server CPU per task, processing (extra)", "µs", False),
]

SUMMARY = [
    ("enqueue_rate", "enqueue /s"),
    ("enqueue_batch_rate", "batched /s"),
    ("process_rate", "processed /s"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p99_ms", "p99 ms"),
    ("worker_cpu_us", "worker µs/task"),
    ("process_cmds", "cmds/task"),
    ("enqueue_cmds", "enqueue cmds/task"),
    ("memory_delta_kib", "memory Δ KiB"),
]


def aggregate(
    runs: list[dict[str, Any]], specs: list[Any], unavailable: dict[str, str]
) -> dict[str, Any]:
    """Per system: each figure's values over the rounds, median, min, max, and the ratios of
    its median to the best peer's median and to the floor's."""
    systems: dict[str, Any] = {}
    for spec in specs:
        mine = [r for r in runs if r["system"] == spec.name]
        figures: dict[str, Any] = {}
        for fig in FIGURES:
            values = [r.get("figures", {}).get(fig.key) for r in mine]
            values = [v for v in values if v is not None]
            if values:
                figures[fig.key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "values": values,
                }
        systems[spec.name] = {
            "label": spec.label,
            "peer": spec.peer,
            "workers": spec.workers,
            "available": spec.name not in unavailable,
            "reason": unavailable.get(spec.name),
            "versions": mine[0].get("versions", {}) if mine else {},
            "errors": [f"round {r['round']}: {e}" for r in mine for e in r.get("errors", [])],
            "figures": figures,
        }
    best: dict[str, str] = {}
    for fig in FIGURES:
        peers = [
            (s["figures"][fig.key]["median"], name)
            for name, s in systems.items()
            if s["peer"] and fig.key in s["figures"]
        ]
        if peers:
            best[fig.key] = (max if fig.higher_is_better else min)(peers)[1]
    for s in systems.values():
        for key, value in s["figures"].items():
            value["vs_best_peer"] = _ratio(value["median"], systems, best.get(key), key)
            value["vs_floor"] = _ratio(value["median"], systems, "floor", key)
    return {"systems": systems, "best_peer": best}


def _ratio(value: float, systems: dict[str, Any], ref: str | None, key: str) -> float | None:
    if ref is None or ref not in systems or key not in systems[ref]["figures"]:
        return None
    base = systems[ref]["figures"][key]["median"]
    return value / base if base > 0 and value >= 0 else None


def _num(value: float | None, digits: int) -> str:
    if value is None:
        return NONE
    if digits == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _times(ratio: float | None) -> str:
    return NONE if ratio is None else f"{ratio:.2f}{TIMES}"


def markdown(data: dict[str, Any]) -> str:
    meta, systems, best = data["meta"], data["systems"], data["best_peer"]
    digits = {f.key: f.digits for f in FIGURES}
    lines = [
        f"# Tether benchmark, {meta['started']}",
        "",
        f"- **N = {meta['n']:,} tasks, {meta['rounds']} round(s)**, the order of systems rotated "
        f"each round; concurrency {meta['concurrency']} per worker process; "
        f"{meta['probes']} latency probes {meta['probe_gap_ms']} ms apart.",
        f"- Server: {meta['server']}.",
        f"- Cores: {meta['pinning']}.",
        f"- Machine: {meta['cpu']}, {meta['cores']} cores; Python {meta['python']}.",
        *(
            ["- **Profiled with py-spy: these figures are perturbed, do not compare them.**"]
            if meta.get("profiled")
            else []
        ),
        "",
        "## Summary (medians)",
        "",
        "| system | " + " | ".join(label for _, label in SUMMARY) + " |",
        "|---|" + "---:|" * len(SUMMARY),
    ]
    for s in systems.values():
        if not s["available"]:
            continue
        cells = [_num(s["figures"].get(k, {}).get("median"), digits[k]) for k, _ in SUMMARY]
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Every figure",
        "",
        f"Median and spread (min{DASH}max) over the rounds. ÷ best peer and ÷ floor are this "
        "median divided by the best peer's median (the best among the PyPI peers, named in "
        "the figure's first row) and by the floor's. For rates higher is better; for "
        "latency, CPU, commands and memory lower is better.",
        "",
        f"| figure | system | median | min{DASH}max | ÷ best peer | ÷ floor |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for fig in FIGURES:
        first = True
        unit = f" ({fig.unit})" if fig.unit else ""
        for s in systems.values():
            value = s["figures"].get(fig.key)
            if value is None:
                continue
            label = f"{fig.label}{unit}" if first else ""
            if first and fig.key in best:
                label += f"; best peer: {systems[best[fig.key]]['label']}"
            first = False
            spread = f"{_num(value['min'], fig.digits)}{DASH}{_num(value['max'], fig.digits)}"
            lines.append(
                f"| {label} | {s['label']} | {_num(value['median'], fig.digits)} | {spread} "
                f"| {_times(value['vs_best_peer'])} | {_times(value['vs_floor'])} |"
            )
    missing = [s for s in systems.values() if not s["available"]]
    failed = [s for s in systems.values() if s["errors"]]
    if missing or failed:
        lines += ["", "## Not measured, or measured in part", ""]
        for s in missing:
            lines.append(f"- **{s['label']}**: not installed: {s['reason']}")
        for s in failed:
            for error in s["errors"]:
                first_line = error.splitlines()[0] if error else error
                lines.append(f"- **{s['label']}**, {first_line}")
    versions = {
        s["label"]: ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        for s in systems.values()
        if s["versions"] and s["available"]
    }
    if versions:
        lines += ["", "## Versions", ""]
        lines += [f"- {label}: {text}" for label, text in versions.items()]
    return "\n".join(lines) + "\n"
