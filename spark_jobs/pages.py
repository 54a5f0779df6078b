"""HTML pages from Jinja2 templates, escaped by default: what comes from the data (an
expectation's observed values, a stream's state) can never become markup. A template lives
in the ``templates`` folder beside the module that renders it (package data of the wheel).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jinja2


def shown(value: object) -> object:
    """An absent value (None, NaN) as a dash."""
    return "–" if value is None or value != value else value


@cache
def _environment(folder: Path) -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["shown"] = shown
    return environment


def render(module_file: str, template: str, **context: Any) -> str:
    """``templates/<template>`` beside ``module_file`` (the caller's ``__file__``)."""
    folder = Path(module_file).resolve().parent / "templates"
    return _environment(folder).get_template(template).render(**context)
