"""``airflow standalone`` with every port on loopback, for ``lakehouse demo``.

Airflow's scheduler and triggerer each start a task log server (ports 8793 and 8794), which
the API server asks for the log of a running task. Airflow binds it to every interface,
with no setting to change that (``airflow/utils/serve_logs/core.py`` passes ``host=""``).
On one machine the API server is its only client, so here the components start through this
module, which binds the log server to loopback; Airflow names the machine ``127.0.0.1``
(``hostname_callable``), so the API server asks for a log there.

``python -m spark_jobs.airflow_standalone`` is ``airflow standalone``;
``python -m spark_jobs.airflow_standalone component <args>`` is ``airflow <args>``, one of its
components.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

from spark_jobs.config import LOOPBACK

MODULE = "spark_jobs.airflow_standalone"  # also when run as __main__
HOSTNAME_CALLABLE = f"{MODULE}.loopback_hostname"


def loopback_hostname() -> str:
    """This machine's name for Airflow: where its log servers listen."""
    return LOOPBACK


def _airflow(airflow_args: list[str]) -> None:
    """The ``airflow`` command itself (which also writes the configuration, with its
    generated secrets, once, before the components start and read it)."""
    from airflow.__main__ import main

    sys.argv = ["airflow", *airflow_args]
    main()


def component(airflow_args: list[str]) -> None:
    """``airflow <airflow_args>``, its log server (a child process) bound to loopback."""
    _bind_log_server_to_loopback()
    _airflow(airflow_args)


def _bind_log_server_to_loopback() -> None:
    from airflow.utils.serve_logs import core

    serve = core.uvicorn.run

    def on_loopback(*args: Any, **kwargs: Any) -> None:
        serve(*args, **{**kwargs, "host": LOOPBACK})

    # Only the log server's uvicorn: the API server binds where AIRFLOW__API__HOST says.
    core.uvicorn = SimpleNamespace(run=on_loopback)


def standalone() -> None:
    """``airflow standalone``, its components started by :func:`component`."""
    from airflow.cli.commands import standalone_command

    class Component(standalone_command.SubCommand):
        def run(self) -> None:
            # As Airflow's SubCommand.run, with this module in place of the airflow script.
            self.process = subprocess.Popen(
                [sys.executable, "-m", MODULE, "component", *self.command],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env)
            for line in self.process.stdout or ():
                self.parent.output_queue.append((self.name, line))

    standalone_command.SubCommand = Component
    _airflow(["standalone"])


if __name__ == "__mp_main__":
    # A component's log server started with the spawn method (macOS) imports this module
    # afresh under this name instead of inheriting the patched one: patch it here too.
    _bind_log_server_to_loopback()
elif __name__ == "__main__":
    if sys.argv[1:2] == ["component"]:
        component(sys.argv[2:])
    else:
        standalone()
