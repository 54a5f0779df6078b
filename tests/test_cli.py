import ast
import subprocess
from pathlib import Path

import pytest

from spark_jobs.config import PROJECT_DIR
from tests.conftest import cli_env, lakehouse_command
from tests.processes import free_port


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lakehouse_command(*args), capture_output=True, text=True,
                          env=cli_env(), timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (("generate", "--events", "-5"), "must not be negative"),
    (("generate", "--malformed", "2"), "between 0 and 1"),
    (("generate", "--start", "next tuesday"), "not an ISO-8601 time"),
    (("stream", "--layers", "platinum"), "unknown layer platinum"),
    (("stream", "--trigger", "soon"), "not an interval"),
    (("frobnicate",), "invalid choice"),
    # --late may follow a range (the nightly run does both), not a quarantine replay.
    (("reprocess", "--quarantine", "--late"), "give one of"),
    (("reprocess", "--from", "2026-11-02", "--to", "2026-11-01", "--late"), "after"),
    # A path argument cannot leave the root, however it is spelled.
    (("audit", "--expected", "/etc/passwd"), "is outside the root"),
    (("audit", "--expected", "../../etc/passwd"), "is outside the root"),
    (("demo", "--trigger", "soon"), "not an interval"),  # before Airflow starts
    (("chaos", "--faults", "0"), "must be positive"),
])
def test_bad_arguments_get_one_line_and_a_non_zero_exit(tmp_path: Path, args: tuple[str, ...],
                                                         message: str) -> None:
    result = run_cli(*args, "--root", str(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_the_chaos_battery_refuses_a_root_that_holds_a_lake(tmp_path: Path) -> None:
    # It proves its counts against what its own feed delivered: older data would be counted.
    assert run_cli("generate", "--root", str(tmp_path), "--events", "10").returncode == 0
    result = run_cli("chaos", "--root", str(tmp_path), "--faults", "1")
    assert result.returncode == 2
    assert "already holds a lake" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_unwritable_root_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # Running as root defeats permission bits; a root under a plain file fails for anyone.
    result = run_cli("generate", "--root", str(blocker / "lake"))
    assert result.returncode == 2
    assert "is not writable" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_commands_started_together_both_find_the_root_writable(tmp_path: Path) -> None:
    """The chaos battery caught a stream refusing its root ("not writable: No such file or
    directory") as a reprocess started beside it: each removed the other's probe file."""
    from concurrent.futures import ThreadPoolExecutor

    from spark_jobs.cli import _writable_root
    from tests.conftest import make_settings

    settings = make_settings(tmp_path / "lake")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _writable_root(settings), range(400)))
    assert list(settings.root.iterdir()) == []  # no probe left behind


def test_generate_writes_the_landing_zone_and_expected_counts(tmp_path: Path) -> None:
    result = run_cli("generate", "--root", str(tmp_path), "--events", "1200", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "landing" / "events").iterdir())) == 1  # 1200 <= 5000 a file
    assert (tmp_path / "landing" / "expected_counts.json").exists()
    assert len(list((tmp_path / "landing" / "campaigns").iterdir())) == 2


def test_clean_generation_and_the_landing_feed_go_through_the_verb(tmp_path: Path) -> None:
    from spark_jobs import landing_feed

    # --clean: every record valid and distinct, but a share given still applies (2% of
    # 500 records duplicated, in expectation: some, and far fewer than half).
    counts = landing_feed.generate(tmp_path / "clean", "--clean", "--events", "500",
                                   env=cli_env())
    assert counts["delivered"] == counts["valid_distinct"] == 500
    assert counts["invalid"] == counts["duplicates"] == counts["blank_lines"] == 0
    counts = landing_feed.generate(tmp_path / "twins", "--clean", "--duplicate", "0.02",
                                   "--events", "500", env=cli_env())
    assert counts["invalid"] == 0 and 0 < counts["duplicates"] < 100
    with pytest.raises(landing_feed.GenerateFailed, match="between 0 and 1"):
        landing_feed.generate(tmp_path / "bad", "--late", "7", env=cli_env())


def test_only_the_cli_verb_imports_the_test_data_generator() -> None:
    # The demo, the benchmarks, chaos and the class archive generate through the verb
    # (spark_jobs.landing_feed); the tests may import it.
    importers = set()
    for folder in ("spark_jobs", "plugins", "dags"):
        for path in (PROJECT_DIR / folder).rglob("*.py"):
            source = path.read_text()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):  # absolute or relative, module or name
                    module = "spark_jobs" if node.level else node.module or ""
                    names = [f"{module}.{node.module}" if node.level and node.module
                             else module,
                             *(f"{module}.{alias.name}" for alias in node.names)]
                else:
                    continue
                if "spark_jobs.generator" in names:
                    importers.add(str(path.relative_to(PROJECT_DIR)))
            if '"spark_jobs.generator"' in source:  # importlib.import_module
                importers.add(str(path.relative_to(PROJECT_DIR)))
    assert importers == {"spark_jobs/cli.py"}


def test_a_kafka_source_without_a_broker_is_refused_not_replaced_by_files(tmp_path: Path
                                                                         ) -> None:
    # Events in the landing zone, but the stream is configured for Kafka, where no broker
    # answers: it says so and reads nothing else instead.
    closed_port = free_port()
    generated = subprocess.run(lakehouse_command("generate", "--root", str(tmp_path),
                                                 "--events", "100"),
                               env=cli_env(), capture_output=True, timeout=120)
    assert generated.returncode == 0
    done = subprocess.run(
        lakehouse_command("stream", "--root", str(tmp_path), "--layers", "bronze",
                          "--available-now"),
        env=cli_env(LAKEHOUSE_SOURCE="kafka",
                    LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{closed_port}"),
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    assert (f"Kafka at 127.0.0.1:{closed_port} does not answer" in done.stderr
            and "lakehouse services start kafka" in done.stderr), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "tables" / "bronze").exists()
