"""The app every command works on: ``APP`` as the first positional argument (the documented
form, as in ``tether worker myapp.tasks:app``), with ``--app``/``-A`` kept as a hidden alias,
so neither guess a user makes fails.

Some commands take ids after the app (``tether task status [APP] TASK_ID``, ``tether dead
retry [APP] [ID]...``) and the app may be left out there: the first positional word is then
read as an id when it cannot be an app (before a list of ids, the app is ``module:attribute``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import click

from ._common import F

_APP_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?$")
"""``module`` or ``module:attribute`` (dotted): what :func:`load_app` imports."""
_HEX_ID = re.compile(r"^[0-9a-f]{32}")


APP_HELP = (
    "APP is module:attribute (for example myapp.tasks:app): the app's URL, namespace and "
    "serializer are used, and --url and --namespace win over them. Without APP: the server "
    "and namespace of --url and --namespace."
)
"""The epilog of the commands whose APP is optional and whose text does not say it."""


def could_be_app(word: str) -> bool:
    """``word`` names a module (and attribute), and is no entry id or task id. A task id's
    shape is loose (``<queue>:<token>``, for taskiq's ids too), so ``module:attribute`` is one;
    Tether's and taskiq's ids are ``<queue>:<32 hex digits>[...]`` or ``<queue>:<N>-<entry
    id>``, which no attribute name matches but the first."""
    _, _, attribute = word.partition(":")
    return bool(_APP_SPEC.match(word)) and not _HEX_ID.match(attribute)


def app_argument(
    *, required: bool = False, then: str | None = None, then_metavar: str = ""
) -> Callable[[F], F]:
    """``[APP]`` (or ``APP`` when ``required``) and its hidden alias ``--app``/``-A``; the
    command receives ``app_spec``. Place it above the command's other arguments.

    ``then`` names the positional parameter that follows the app (an id, or a tuple of ids):
    when the app is left out, or given as ``--app``, the first positional word is that
    parameter's, unless it can only be the app. A single id (``then_metavar`` in messages)
    is required; the command's own argument is declared ``required=False`` for that."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            positional, alias = kwargs.pop("app_spec"), kwargs.pop("app_alias")
            if then is not None and positional is not None:
                positional = _give_back(kwargs, then, positional)
            if then is not None and kwargs[then] is None:
                raise click.UsageError(f"Missing argument '{then_metavar}'.")
            if positional is not None and alias is not None and positional != alias:
                raise click.UsageError(
                    f"the app is given twice, as {positional!r} and as --app {alias!r}: "
                    "give it once (APP, the first argument)"
                )
            spec = positional if positional is not None else alias
            if spec is None and required:
                raise click.UsageError("Missing argument 'APP' (module:attribute).")
            return fn(*args, app_spec=spec, **kwargs)

        with_alias = click.option(
            "--app", "-A", "app_alias", default=None, metavar="APP", hidden=True
        )(wrapper)
        metavar = "APP" if required else "[APP]"
        with_app = click.argument("app_spec", metavar=metavar, required=False)(with_alias)
        return with_app  # type: ignore[return-value]

    return decorate


def _give_back(kwargs: dict[str, Any], then: str, word: str) -> str | None:
    """The first positional word went to APP: hand it to ``then`` when it is that
    parameter's. Returns what is left for the app."""
    following = kwargs[then]
    if isinstance(following, tuple):  # any number of ids: the app is module:attribute there
        # A bare word (``nonsense``) is more likely a mistyped id than a module: the id's
        # check then names both forms of an id, where an import error would mislead.
        if ":" in word and could_be_app(word):
            return word
        kwargs[then] = (word, *following)
        return None
    if following is None:  # one word: it is the id (the app left out or given as --app)
        kwargs[then] = word
        return None
    return word
