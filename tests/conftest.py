"""Shared fixtures: one SparkSession for the whole run, a fresh lakehouse root per test."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs import config
from spark_jobs.config import Settings

VENV_BIN = Path(sys.executable).parent

# Every driver of the suite runs small data for seconds to minutes, where the JIT's top tier
# (C2) costs its compilations on two cores and pays back little: compiled by C1 alone, a
# cold `lakehouse stream --available-now` of 600 events took 26 s against 33 s, its audit
# 14.5 s against 18.7 s, a day's reprocess 20.5 s against 25.2 s (2 December, alternated).
# The product keeps C2: a million records ran 2-3% faster with it, and the suite's own
# long-lived session (in-process tests) 20% faster, so only the commands the tests start
# get C1. C1 alone keeps every method it compiles: the code cache gets the room the tiers
# would have had (its default of 48 MB filled within a run, and the JVM failed).
# The product's own options first. (Read once, here: loading settings also points this
# process's object-store readers at their store, which a test may have set otherwise.)
SUITE_JAVA_OPTIONS = (f"{config.load(environ={}).spark_java_options} "
                      "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=512m")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave the root logger without the handlers the run gave it (importing Airflow
    configures it), which write to pytest's captured streams, closed by now: py4j's
    connections, collected as the interpreter exits, would log their close to them."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)


def make_settings(root: Path, **overrides: object) -> Settings:
    """Settings from the checked-in defaults only, so a developer's environment can't leak in."""
    return config.load({"root": root, "shuffle_partitions": 2, **overrides}, environ={})


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from spark_jobs.session import build_spark

    session = build_spark(make_settings(tmp_path_factory.mktemp("spark-session")),
                          app_name="lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def no_leftover_streams() -> Iterator[None]:
    """A failed test must not leave a stream running into the next one."""
    from tests.processes import kill_leftovers

    yield
    kill_leftovers()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """Where a test keeps what a person should be able to look at afterwards (screenshots):
    ``test-artifacts/<test>`` (git-ignored), or under ``$LAKEHOUSE_TEST_ARTIFACTS``."""
    base = Path(os.environ.get("LAKEHOUSE_TEST_ARTIFACTS", "test-artifacts"))
    return base.resolve() / request.node.name


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path / "lake")


def lakehouse_command(*args: str) -> list[str]:
    """The real console script of this environment."""
    return [str(VENV_BIN / "lakehouse"), *args]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    env.update(LAKEHOUSE_SHUFFLE_PARTITIONS="2",
               LAKEHOUSE_SPARK_JAVA_OPTIONS=SUITE_JAVA_OPTIONS, **extra)
    return env
