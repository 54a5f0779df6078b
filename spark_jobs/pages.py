"""HTML pages from Jinja2 templates, escaped by default: what comes from the data (an
expectation's observed values, a stream's state) can never become markup. A template lives
in the ``templates`` folder of the package that renders it (package data of the wheel).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2


def shown(value: object) -> object:
    """An absent value (None, NaN) as a dash."""
    return "–" if value is None or value != value else value


@cache
def _environment(package: str) -> jinja2.Environment:
    # A package loader reads the templates from a zip as well (the code a cluster's
    # driver imports from spark-submit's --py-files).
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["shown"] = shown
    return environment


def render(package: str | None, template: str, **context: Any) -> str:
    """``templates/<template>`` of ``package`` (the caller's ``__package__``)."""
    if not package:
        raise ValueError(f"{template}: render from a module of a package")
    return _environment(package).get_template(template).render(**context)
