"""Shared fixtures: one SparkSession for the whole run, a fresh lakehouse root per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs import config
from spark_jobs.config import Settings

VENV_BIN = Path(sys.executable).parent


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
    env.update(LAKEHOUSE_SHUFFLE_PARTITIONS="2", **extra)
    return env
