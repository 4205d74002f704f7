"""Tether with the worker's Prometheus metrics on (``tether worker --metrics-port``): what
counting every attempt costs, measured beside the default row. The worker serves /metrics
on a free loopback port; nothing scrapes it during the run (a scrape reads counters once,
off the event loop, and costs nothing per task)."""

from __future__ import annotations

from . import tether as plain


class Adapter(plain.Adapter):
    def worker_argv(self, name: str) -> list[str]:
        return [*super().worker_argv(name), "--metrics-port", "0"]
