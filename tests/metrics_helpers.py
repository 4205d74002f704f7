"""Scraping a /metrics endpoint over HTTP, checking the exposition with promtool, and
reading values back with prometheus-client's parser."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def promtool() -> str:
    """The promtool binary: a test that needs it fails (never skips) without it."""
    found = shutil.which("promtool")
    assert found, "promtool is missing: install Debian's prometheus package (.ci/run does)"
    return found


def promtool_run(*args: str | Path, stdin: str | None = None) -> str:
    done = subprocess.run(
        [promtool(), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))} failed:\n{output}"
    return output


def check_exposition(text: str) -> None:
    """``promtool check metrics``: the format, and the naming conventions (``_total`` on
    counters, base units, help texts)."""
    promtool_run("check", "metrics", stdin=text)


@dataclass
class Scrape:
    status: int
    text: str
    content_type: str

    @property
    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        out = {}
        for family in text_string_to_metric_families(self.text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def labelled(self, name: str) -> list[Mapping[str, str]]:
        return [dict(labels) for n, labels in self.samples if n == name]


def scrape(url: str, *, token: str | None = None, accept: str | None = None) -> Scrape:
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if accept is not None:
        headers["Accept"] = accept
    response = httpx.get(url, headers=headers, timeout=15)
    return Scrape(response.status_code, response.text, response.headers.get("content-type", ""))
