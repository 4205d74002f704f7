"""The ``tether`` command: worker, demo, dead letters, tasks, schedules, info, web, exporter.

Each command lives in its own module and imports the library lazily, so ``tether --help``
starts fast and no command module imports another's."""

from __future__ import annotations

import click

from ..base._version import __version__
from ._check import check
from ._dead import dead
from ._demo import demo
from ._exporter import exporter
from ._info import info
from ._schedules import scheduler, schedules
from ._task import task
from ._web import web
from ._worker import worker

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tether")
def main() -> None:
    """Tether: a task queue on Redis Streams that loses no task and robs no live worker."""


for command in (worker, demo, dead, task, schedules, scheduler, info, web, exporter):
    main.add_command(command)
main.add_command(check)  # tether check: a worker's liveness, for orchestrators
