"""``make bench``'s start-up part: what a cold driver JVM costs, with the class archive and
without it, side by side.

Each sample is one real ``lakehouse`` command in a fresh process, as a user, an Airflow task
or a test starts it: ``lakehouse stream --available-now`` over a small generated lake on a
fresh root (a session, every table created, each stream's first batch), then ``lakehouse
audit`` on it. Without the archive means the same jars from a folder that has none.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from spark_jobs import class_archive
from spark_jobs.config import Settings, console_script

COMMANDS = {"stream": ("stream", "--available-now"), "audit": ("audit", "--expected")}
EVENTS = 300


def run(settings: Settings, scratch: Path, repetitions: int) -> dict[str, Any]:
    archive = class_archive.archive_path(settings)
    if not archive.is_file():
        raise FileNotFoundError(f"no class archive at {archive}: run make setup")
    bare_jars = scratch / "jars-without-archive"
    shutil.rmtree(scratch, ignore_errors=True)
    bare_jars.mkdir(parents=True)
    for jar in settings.jars_dir.glob("*.jar"):
        os.symlink(jar, bare_jars / jar.name)
    samples: dict[str, dict[str, list[float]]] = {
        mode: {name: [] for name in COMMANDS} for mode in ("with", "without")}
    for repetition in range(repetitions):
        for mode, jars in (("with", settings.jars_dir), ("without", bare_jars)):
            root = scratch / f"{mode}-{repetition}"
            _lakehouse(jars, "generate", "--root", str(root), "--events", str(EVENTS))
            for name, command in COMMANDS.items():
                samples[mode][name].append(
                    _lakehouse(jars, command[0], "--root", str(root), *command[1:]))
    medians = {mode: {name: round(statistics.median(times), 1) for name, times in runs.items()}
               for mode, runs in samples.items()}
    return {"events": EVENTS, "repetitions": repetitions, "seconds": samples,
            "median_seconds": medians,
            "speedup": {name: round(medians["without"][name] / medians["with"][name], 2)
                        for name in COMMANDS}}


def _lakehouse(jars: Path, *args: str) -> float:
    env = {**os.environ, "LAKEHOUSE_JARS_DIR": str(jars)}
    started = time.perf_counter()
    subprocess.run([console_script("lakehouse"), *args], env=env,
                   check=True, capture_output=True, timeout=600)
    return round(time.perf_counter() - started, 2)


def render(results: dict[str, Any]) -> str:
    medians = results["median_seconds"]
    lines = [f"a cold lakehouse command, {results['events']} events, median of "
             f"{results['repetitions']}", f"{'command':<32}{'archive':>9}{'without':>9}"
             f"{'speed-up':>10}"]
    for name, command in COMMANDS.items():
        lines.append(f"{'lakehouse ' + ' '.join(command):<32}{medians['with'][name]:>8}s"
                     f"{medians['without'][name]:>8}s{results['speedup'][name]:>9}x")
    return "\n".join(lines)
