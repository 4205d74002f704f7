"""Jinja2 templates shipped in the package (``tether/web/templates``): no CDN, no asset
fetched at run time, so the pages work air-gapped. The filters of :mod:`._format` format
numbers and times for people in every template."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.templating import Jinja2Templates

from ._format import FILTERS

environment = Environment(
    loader=PackageLoader("tether.web", "templates"),
    autoescape=select_autoescape(default=True),
    # A misspelt variable fails the page's test rather than rendering as nothing.
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters.update(FILTERS)
templates = Jinja2Templates(env=environment)
