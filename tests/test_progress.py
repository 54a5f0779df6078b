"""Progress of long commands: shown on a terminal, silent anywhere else."""

import os
import pty
import subprocess

from spark_jobs import progress
from tests.conftest import cli_env, lakehouse_command


class Recorder:
    """A ``progress.Steps`` that notes what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def start(self, description: str, total: float | None = None) -> None:
        self.seen.append(("start", description, total))

    def advance(self, amount: float = 1, doing: str | None = None) -> None:
        self.seen.append(("advance", amount, doing))


def on_a_terminal(*command: str) -> tuple[str, str, int]:
    """``command`` with its stderr on a pseudo-terminal: (terminal text, stdout, exit)."""
    terminal, child_side = pty.openpty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=child_side,
                               env={**cli_env(), "COLUMNS": "160"})
    os.close(child_side)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        shown += chunk
    stdout = process.stdout.read().decode()
    os.close(terminal)
    return shown.decode(errors="replace"), stdout, process.wait()


def test_generate_shows_its_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path) -> None:
    command = lakehouse_command("generate", "--root", str(tmp_path / "a"), "--events", "6000",
                                "--events-per-file", "1000")
    shown, stdout, code = on_a_terminal(*command)
    assert code == 0
    assert "writing events to" in shown and "6000/6000" in shown, shown[-500:]
    assert '"delivered": 6000' in stdout  # the JSON on stdout is untouched

    piped = subprocess.run(lakehouse_command("generate", "--root", str(tmp_path / "b"),
                                             "--events", "6000"),
                           capture_output=True, text=True, env=cli_env())
    assert piped.returncode == 0 and piped.stderr == ""


def test_silent_unless_wanted_on_a_terminal_without_json() -> None:
    # Under pytest stderr is captured: not a terminal.
    assert not progress.wanted() and not progress.wanted(json_output=True)
    with progress.steps(False) as steps:
        assert steps is progress.SILENT


def test_maintenance_says_which_table_and_operation_it_is_on(spark, settings) -> None:
    from spark_jobs.maintenance import maintain

    steps = Recorder()
    maintain(spark, settings, ["gold.campaign_stats", "gold.ad_attribution"],
             run_optimize=True, run_vacuum=False, retention=None, dry_run=True, steps=steps)
    # Two tables, one operation each: announced, then counted done.
    assert steps.seen == [
        ("start", "maintenance (dry run)", 2),
        ("advance", 0, "OPTIMIZE gold.campaign_stats"), ("advance", 1, None),
        ("advance", 0, "OPTIMIZE gold.ad_attribution"), ("advance", 1, None)]
