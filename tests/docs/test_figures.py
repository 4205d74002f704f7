"""One source per measured figure.

The comparison page holds the two tables of measured figures that other pages quote: the run
of ``bench/run.py`` (its benchmark table) and the run of ``bench/promises.py`` (Tether's
protocol figures), both of 2026-12-06. A page that quotes one of them must quote the value
the table gives, name the run and link to it; ratios computed from them must match. So a
new run that replaces a table fails here until every quote of it is replaced too, and two
runs' figures can no longer sit side by side unnamed.
"""

from __future__ import annotations

import re

import pytest

from ..helpers import ROOT

DOCS = ROOT / "docs"
COMPARISON = DOCS / "comparison.md"


def _table_after(text: str, marker: str) -> list[list[str]]:
    """The cells of the first Markdown table after the line that contains ``marker``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table after {marker!r}"
    return rows[2:]  # the header and the alignment row left out


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def bench_table() -> dict[str, dict[str, str]]:
    """The benchmark table of the comparison: row name -> column -> cell."""
    text = COMPARISON.read_text()
    header_line = next(line for line in text.splitlines() if line.startswith("| system |"))
    header = [cell.strip() for cell in header_line.strip().strip("|").split("|")]
    rows = _table_after(text, "## Benchmarks")
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def protocol_table() -> dict[str, str]:
    """Tether's protocol figures on the comparison page: figure -> value."""
    rows = _table_after(COMPARISON.read_text(), "### Tether's protocol figures")
    return {row[0]: row[1] for row in rows}


def _protocol(starts: str) -> str:
    found = [value for figure, value in protocol_table().items() if figure.startswith(starts)]
    assert len(found) == 1, (starts, found)
    return found[0]


def test_the_sigkill_recovery_is_measured_once_on_the_comparison_page() -> None:
    """The features table states the bound and links to the one measured figure (before,
    it gave 9.1 to 9.6 s from an older run, beside the table's 9.70 s median)."""
    text = COMPARISON.read_text()
    measured = [
        line
        for line in text.splitlines()
        if "SIGKILL" in line and re.search(r"\d+\.\d+(\u2013\d+\.\d+)? s\b", line)
    ]
    assert len(measured) == 1, measured
    assert measured[0].startswith("| `SIGKILL` of the worker running a task")
    assert re.fullmatch(
        r"median \d+\.\d+ s \(\d+\.\d+ to \d+\.\d+, \d+ runs\)",
        _protocol("`SIGKILL` of the worker running a task"),
    )
    features_row = next(line for line in text.splitlines() if "**Recovery after SIGKILL**" in line)
    tether_cell = features_row.split("|")[2]
    assert "(11 s)" in tether_cell
    assert "(#tethers-protocol-figures)" in tether_cell
    assert "### Tether's protocol figures" in text
    assert "`python3 bench/promises.py` on the same machine the same day, 2026-12-06" in " ".join(
        text.split()
    )


def test_the_comparisons_own_ratios_follow_from_its_table() -> None:
    rows = bench_table()
    tether = _number(rows["Tether"]["processed /s"])
    text = " ".join(COMPARISON.read_text().split())

    def ratio(row: str) -> float:
        return tether / _number(rows[row]["processed /s"])

    assert (
        f"Tether processed {ratio('taskiq + taskiq-redis'):.1f} times as many tasks a second "
        "as the fastest peer (taskiq with taskiq-redis), "
        f"{ratio('SAQ'):.1f} times SAQ's rate and {ratio('streaq'):.1f} times streaq's, "
        f"at {ratio('floor (bare redis-py)'):.2f} of the bare floor's rate"
    ) in text


def _flat(page: str) -> str:
    return " ".join((DOCS / page).read_text().split())


def test_operate_quotes_the_statistics_cost_from_the_comparisons_run() -> None:
    """docs/operate.md gave 9,820 against 10,392 /s from another run (5 rounds), unnamed;
    now it quotes the comparison's rows, names the run and links to it."""
    rows = bench_table()
    on, off = rows["Tether"], rows["Tether, statistics off"]
    fewer = 1 - _number(on["processed /s"]) / _number(off["processed /s"])
    text = _flat("operate.md")
    assert (
        f"{on['processed /s']} against {off['processed /s']} tasks a second "
        f"({round(fewer * 100)} % fewer), "
        f"{on['worker CPU µs/task']} against {off['worker CPU µs/task']} µs of worker CPU and "
        f"{on['commands/task']} against {off['commands/task']} server commands per task"
    ) in text
    assert (
        "In the run of 2026-12-06 that the [comparison's benchmark table](comparison.md#benchmarks)"
        in text
    )
    assert "9,820" not in text
    assert "10,392" not in text


def test_sizing_quotes_the_comparisons_runs() -> None:
    rows = bench_table()
    text = _flat("deploy/sizing.md")
    plain, stored, retried = _protocol("commands per task, processing").split(" / ")
    assert f"3.2 (`bench/sizing.py`); {plain} (`bench/promises.py`)" in text
    assert f"7.2 (`bench/sizing.py`); {stored} (`bench/promises.py`)" in text
    assert f"| {retried} (`bench/promises.py`) |" in text
    idle = re.fullmatch(r"about (\d+) commands a second", _protocol("an idle worker, one queue"))
    assert idle
    assert f"An idle worker serving one queue costs about **{idle[1]} commands per second**" in text
    per_day = int(idle[1]) * 86_400 / 1e6
    assert f"about {per_day:.1f} million commands a day" in text
    on, off = rows["Tether"]["commands/task"], rows["Tether, statistics off"]["commands/task"]
    added = _number(on) - _number(off)
    assert (
        f"{added:.1f} in the benchmark's processing row ({on} per task with statistics on, "
        f"{off} with `Tether(stats=False)`, in the run of 2026-12-06"
    ) in text
    assert text.count("(../comparison.md#tethers-protocol-figures)") >= 3


def test_taskiq_quotes_the_comparisons_taskiq_rows() -> None:
    rows = bench_table()
    ours, theirs = rows["taskiq + Tether's `TetherBroker`"], rows["taskiq + taskiq-redis"]
    times = _number(ours["processed /s"]) / _number(theirs["processed /s"])
    text = _flat("taskiq.md")
    assert (
        f"taskiq processed {ours['processed /s']} tasks a second on `TetherBroker` against "
        f"{theirs['processed /s']} on taskiq-redis's `RedisStreamBroker` ({times:.2f} times), "
        f"at {ours['worker CPU µs/task']} against {theirs['worker CPU µs/task']} µs of worker "
        f"CPU per task, with {ours['commands/task']} server commands per task against "
        f"{theirs['commands/task']}"
    ) in text
    assert (
        f"{ours['memory Δ KiB']} KiB of server memory left after the run against "
        f"{theirs['memory Δ KiB']}"
    ) in text
    assert "the run of 2026-12-06 in [the comparison's table](comparison.md#benchmarks)" in text


@pytest.mark.parametrize(
    "column", ["processed /s", "worker CPU µs/task", "enqueue /s", "batched /s"]
)
def test_the_benchmark_guides_tether_row_is_the_comparisons(column: str) -> None:
    """bench/README.md (the benchmark guide page) repeats the Tether row of the same run in
    its metrics-and-tracing table."""
    value = bench_table()["Tether"][column]
    guide = (ROOT / "bench" / "README.md").read_text()
    assert "The rows of a full `python3 bench/run.py` (N = 20,000, 3 rounds) on 2026-12-06" in (
        " ".join(guide.split())
    )
    rows = _table_after(guide, "The rows of a full `python3 bench/run.py`")
    row = next(cells for cells in rows if cells[0] == "Tether (both off)")
    assert any(cell == value or cell.startswith(f"{value} (") for cell in row[1:]), (column, row)
