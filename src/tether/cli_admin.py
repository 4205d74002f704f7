"""Admin commands (dead letters, schedules); filled in with their features."""

from __future__ import annotations

import click


@click.group()
def dead() -> None:
    """Dead-letter stream tools."""


@click.command()
def schedules() -> None:
    """List periodic schedules."""


@click.command()
def scheduler() -> None:
    """Run the scheduler alone."""
