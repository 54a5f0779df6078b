"""Generated landing zones, made as a user makes them: ``lakehouse generate`` in its own
process.

The demo, the benchmarks, the chaos battery and the class archive feed the pipeline
through the verb instead of importing the generator, which is test-data tooling: only its
verb and the tests reach it. A generated root's landing zone is where the root's settings
say (``Settings.landing_events``, ``landing_campaigns``, ``expected_counts_file``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from spark_jobs.config import console_script


class GenerateFailed(RuntimeError):
    """``lakehouse generate`` exited non-zero; the message carries its error output."""


def _command(root: Path, options: tuple[str, ...]) -> list[str]:
    return [console_script("lakehouse"), "generate", "--root", str(root), *options]


def generate(root: Path, *options: str, env: Mapping[str, str] | None = None
             ) -> dict[str, Any]:
    """Generate into ``root``'s landing zone (``options`` as the verb takes them, e.g.
    ``--events 1000 --clean``); the counts it reports (``delivered``, ``records``, ...)."""
    done = subprocess.run(_command(root, options), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise GenerateFailed(f"lakehouse generate {' '.join(options)} exited "
                             f"{done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)["generated"]


def start_feed(root: Path, rate: float, *options: str, env: Mapping[str, str] | None = None,
               log: IO[bytes] | None = None) -> subprocess.Popen[bytes]:
    """A feed of ``rate`` events a second into ``root``'s landing zone, in a process group
    of its own, until it gets SIGTERM (it then finishes its file and records its counts)."""
    return subprocess.Popen(_command(root, ("--rate", f"{rate:g}", *options)), env=env,
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
