"""How far along a long command is, on a terminal: what it is doing, how much is done, and
for how long (``rich``'s progress display, on stderr).

Shown only when stderr is a terminal and the command was not asked for ``--json``;
anywhere else (a pipe, a log file, an Airflow task, ``--json``) it is silent, so output
stays machine-readable. Library functions take a :class:`Steps` and default to
:data:`SILENT`; the CLI hands them the display.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Steps(Protocol):
    def start(self, description: str, total: float | None = None) -> None:
        """A new piece of work, ``total`` units long (None: length unknown)."""

    def advance(self, amount: float = 1, doing: str | None = None) -> None:
        """``amount`` units done; ``doing`` says what comes next."""


class _Silent:
    def start(self, description: str, total: float | None = None) -> None:
        pass

    def advance(self, amount: float = 1, doing: str | None = None) -> None:
        pass


SILENT: Steps = _Silent()


class _Shown:
    """Each ``start`` a line of its own: earlier work stays on screen, done."""

    def __init__(self, display: object) -> None:
        self._display = display
        self._task: object | None = None
        self._description = ""

    def start(self, description: str, total: float | None = None) -> None:
        self._finish()
        self._description = description
        self._task = self._display.add_task(description, total=total)

    def advance(self, amount: float = 1, doing: str | None = None) -> None:
        if self._task is None:
            return
        description = f"{self._description}: {doing}" if doing else self._description
        self._display.update(self._task, advance=amount, description=description)

    def _finish(self) -> None:
        """Work of unknown length shows as complete once the next begins (or all ends)."""
        if self._task is None:
            return
        task = next(task for task in self._display.tasks if task.id == self._task)
        if task.total is None:
            self._display.update(self._task, total=task.completed or 1,
                                 completed=task.completed or 1)
        self._display.update(self._task, description=self._description)


def wanted(json_output: bool = False) -> bool:
    """Whether to show progress: on a terminal, unless the output is to be JSON."""
    return not json_output and sys.stderr.isatty()


@contextmanager
def steps(show: bool) -> Iterator[Steps]:
    """The display while the block runs (``SILENT`` when ``show`` is false)."""
    if not show:
        yield SILENT
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    # stdout is the command's output (JSON, tables): the display never takes it over.
    display = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                       MofNCompleteColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=False,
                       redirect_stdout=False, redirect_stderr=False)
    shown = _Shown(display)
    with display:
        try:
            yield shown
        finally:
            shown._finish()
