"""A module outside the project's apps and settings package. Importing it leaves a mark, so
a test shows that an entry naming it does not make the worker import it."""

import os
from pathlib import Path

_mark = os.environ.get("OUTSIDER_MARK")
if _mark:
    Path(_mark).write_text("imported")


def job() -> None:
    """Never run by a worker."""
