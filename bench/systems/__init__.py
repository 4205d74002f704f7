"""The systems the bench knows: one adapter module each, and how to install it.

This registry is read by the orchestrator (which must not import any peer), so it holds only
names and requirements; ``load`` imports an adapter inside the system's own interpreter.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Adapter


@dataclass(frozen=True)
class Spec:
    name: str
    """As given to --systems."""
    label: str
    """As shown in the table."""
    module: str
    requirements: tuple[str, ...] = ()
    """pip requirements of its own virtual environment; empty: the bench's interpreter."""
    workers: int = 1
    """Worker processes in the processing phase."""
    full: bool = True
    """All phases; otherwise only the processing phase (the multi-process Tether rows)."""
    peer: bool = True
    """A peer from PyPI (counts for 'best peer')."""

    @property
    def venv(self) -> str | None:
        return self.name if self.requirements else None


ROOT = Path(__file__).resolve().parents[2]

# Versions are pinned so a run can be repeated; raise them deliberately. redis[hiredis] is
# added where the peer does not bring it: the task body uses redis-py for every system.
SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec("tether", "Tether", "bench.systems.tether", peer=False),
        Spec(
            "tether-nostats",
            "Tether, statistics off",
            "bench.systems.tether_nostats",
            full=False,
            peer=False,
        ),
        Spec(
            "tether-metrics",
            "Tether, metrics on",
            "bench.systems.tether_metrics",
            full=False,
            peer=False,
        ),
        # Full: tracing costs the producer too (a send span per enqueue call).
        Spec(
            "tether-otel",
            "Tether, tracing on (no-op exporter)",
            "bench.systems.tether_otel",
            peer=False,
        ),
        Spec("floor", "floor (bare redis-py)", "bench.systems.floor", peer=False),
        Spec(
            "taskiq-redis",
            "taskiq + taskiq-redis RedisStreamBroker",
            "bench.systems.taskiq_redis",
            ("taskiq==0.13.0", "taskiq-redis==1.2.4", "redis[hiredis]"),
        ),
        Spec(
            "taskiq-tether",
            "taskiq + Tether TetherBroker",
            "bench.systems.taskiq_tether",
            # taskiq pinned like the taskiq-redis row; this checkout's Tether, editable.
            ("taskiq==0.13.0", "-e", f"{ROOT}[taskiq]"),
            peer=False,
        ),
        Spec(
            "taskiq-redis-streams",
            "taskiq + taskiq-redis-streams",
            "bench.systems.taskiq_streams",
            # 0.2.0 imports taskiq.compat.model_dump, which taskiq 0.13 removed.
            ("taskiq==0.12.6", "taskiq-redis-streams==0.2.0", "redis[hiredis]"),
        ),
        Spec("streaq", "streaq", "bench.systems.streaq", ("streaq==7.2.0", "redis[hiredis]")),
        # SAQ imports typing_extensions without declaring it.
        Spec(
            "saq",
            "SAQ",
            "bench.systems.saq",
            ("saq[redis,hiredis]==0.26.4", "typing_extensions"),
        ),
        Spec("arq", "arq", "bench.systems.arq", ("arq==0.28.0",)),
        Spec(
            "tether-x2",
            "Tether, 2 worker processes",
            "bench.systems.tether",
            workers=2,
            full=False,
            peer=False,
        ),
        Spec(
            "tether-x4",
            "Tether, 4 worker processes",
            "bench.systems.tether",
            workers=4,
            full=False,
            peer=False,
        ),
    )
}

DEFAULT = list(SPECS)


def load(spec: Spec) -> type[Adapter]:
    """The adapter class of ``spec``; imports the system's library."""
    module = importlib.import_module(spec.module)
    adapter: type[Adapter] = module.Adapter
    return adapter
