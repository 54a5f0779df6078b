"""Real `lakehouse` processes for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from spark_jobs import landing_feed
from tests.conftest import cli_env, lakehouse_command

STARTED: list[Driver] = []


def kill_leftovers() -> None:
    """Kill the process group of every stream a test started and did not reap."""
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def committed_versions(table: Path) -> int:
    log = table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def generate(root: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    return landing_feed.generate(root, *args, env=cli_env(**(env or {})))


class Driver(subprocess.Popen[bytes]):
    """A ``lakehouse stream`` process whose stderr goes to a file beside its root.

    Not a pipe: nothing reads a pipe while the test runs, and once its 64 KiB fill up the
    driver (and its JVM, which shares the stream) blocks in its next log line: a driver that
    looks hung mid-run and never sees ``lakehouse stop``.
    """

    log_file: Path

    def log(self) -> str:
        return self.log_file.read_text("utf-8", errors="replace")


def start_stream(root: Path, layers: str, *args: str, files_per_batch: int = 1,
                 env: dict[str, str] | None = None) -> Driver:
    """A stream in its own process group, so a test can kill the driver and its JVM."""
    # One file per micro-batch by default: many commits to die between (or inside).
    env = cli_env(LAKEHOUSE_MAX_FILES_PER_TRIGGER=str(files_per_batch), **(env or {}))
    log_file = root.parent / f"driver-{layers.replace(',', '-')}.log"
    with log_file.open("ab") as log:  # appended to by a restarted driver
        process = Driver(
            lakehouse_command("stream", "--root", str(root), "--layers", layers, *args),
            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    process.log_file = log_file
    STARTED.append(process)
    return process


def wait_for_commits(table: Path, at_least: int, process: Driver) -> None:
    deadline = time.monotonic() + 180
    while committed_versions(table) < at_least:
        assert process.poll() is None, process.log()[-3000:]
        assert time.monotonic() < deadline, "the stream made no progress"
        time.sleep(0.2)


def run_lakehouse(*args: str, timeout: int = 300, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lakehouse_command(*args), env=cli_env(**(env or {})),
                          capture_output=True, text=True, timeout=timeout)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
