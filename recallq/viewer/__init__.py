"""The viewer's templates and assets: the web pages the API serves and the offline report
render the same Jinja2 templates and partials (templates/partials: the run summary, an item's
claims and passages, the comparison), with the one stylesheet (static/viewer.css).

Templates take the plain dicts of recallq.runs.reads, so a page shows the numbers the JSON API
returns. Partials take an optional `item_url` (a callable: item id -> href) so the report can
link within its own file.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

import jinja2

from recallq.core.agreement import MIN_CORRECTED_ITEMS
from recallq.viewer import figures, formatting

STATIC_FILES = ("viewer.css", "viewer.js")


@cache
def environment() -> jinja2.Environment:
    """The templates, HTML-escaped by default, with the viewer's filters and figures."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("recallq.viewer", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(formatting.FILTERS)
    env.globals.update(
        histogram=figures.histogram,
        scatter=figures.scatter,
        marked_passages=figures.marked_passages,
        supporting_passages=figures.supporting_passages,
        min_corrected_items=MIN_CORRECTED_ITEMS,
    )
    return env


def static_directory() -> Path:
    """The directory of STATIC_FILES (the API serves it)."""
    return Path(str(resources.files("recallq.viewer").joinpath("static")))


def static_file(name: str) -> str:
    """The text of one of STATIC_FILES (the report inlines the stylesheet)."""
    if name not in STATIC_FILES:
        raise FileNotFoundError(name)
    return resources.files("recallq.viewer").joinpath("static", name).read_text("utf-8")


def stylesheet() -> str:
    return static_file("viewer.css")
