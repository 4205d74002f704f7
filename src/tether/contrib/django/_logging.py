"""One traceback per failed attempt in a Django worker.

Django's tasks framework logs a failed task with ``logger.exception`` (a receiver of
``task_finished``, "to integrate with error monitoring tools"), and the Tether worker logs the
same failure with its traceback too: every failure printed its traceback twice. Django's
record keeps its traceback (monitoring tools hook it); the worker's line, for an exception
Django's logger has just logged, says where the traceback is instead of repeating it. A
failure Django never saw (a timeout, a task that could not be imported) keeps its traceback
in the worker's line."""

from __future__ import annotations

import logging

from ._compat import FRAMEWORK

_LOGGED = "_tether_traceback_logged"
"""Set on an exception once Django's tasks logger has logged it with its traceback."""


class MarkLogged(logging.Filter):
    """On Django's tasks logger: marks the exception of a record that carries one."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            setattr(exc, _LOGGED, True)
        return True


class SkipLogged(logging.Filter):
    """On the worker's logger: drops the traceback of an exception Django has logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and getattr(exc, _LOGGED, False):
            record.exc_info = record.exc_text = None
            record.msg = f"{record.msg} (traceback: the {FRAMEWORK} line above)"
        return True


def one_traceback_per_failure() -> None:
    """Install the two filters, once however often the worker's app is built."""
    for name, kind in ((FRAMEWORK, MarkLogged), ("tether.worker", SkipLogged)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
