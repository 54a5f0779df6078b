"""The one configuration of the lakehouse.

Precedence, lowest first: the checked-in ``defaults.toml``, an optional file named by
``LAKEHOUSE_CONFIG``, environment variables ``LAKEHOUSE_<KEY>``, then explicit overrides
(CLI flags). Everything else receives a :class:`Settings`; nothing reads the environment.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tomllib
import typing
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
# The folders the project ships beside its code, and the package each is installed as
# (pyproject.toml maps them into the wheel).
BUNDLED_PACKAGES = {"dags": "lakehouse_dags", "plugins": "lakehouse_plugins",
                    "expectations": "lakehouse_expectations"}
# Where every server the project starts listens unless configured otherwise.
LOOPBACK = "127.0.0.1"
SOURCES = ("files", "kafka")
STREAMING_MODES = ("continuous", "scheduled")
_INTERVAL = re.compile(r"^\s*(\d+)\s*(ms|millisecond|second|minute|hour|day|s|m|h|d)s?\s*$")
_UNIT_SECONDS = {
    "ms": 0.001, "millisecond": 0.001, "s": 1, "second": 1,
    "m": 60, "minute": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400,
}


def in_checkout() -> bool:
    """Whether this code runs from the project's checkout (an editable install, ``make``),
    not from an installed wheel."""
    return (PROJECT_DIR / "pyproject.toml").is_file()


def bundled(folder: str) -> Path:
    """``dags``, ``plugins`` or ``expectations``: the checkout's folder, or the installed
    wheel's copy of it."""
    if in_checkout():
        return PROJECT_DIR / folder
    spec = importlib.util.find_spec(BUNDLED_PACKAGES[folder])
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the installed lakehouse has no {folder} folder "
                          f"(package {BUNDLED_PACKAGES[folder]}): reinstall it")
    return Path(next(iter(spec.submodule_search_locations)))


def console_script(name: str) -> str:
    """This environment's own ``lakehouse`` or ``airflow``: what a job starts runs the
    installed code, as Airflow runs it."""
    return str(Path(sys.executable).parent / name)


class ConfigError(ValueError):
    """A configuration value that cannot be used; its message is meant for the user."""


def interval_seconds(text: str) -> float:
    """Seconds in an interval such as ``5s``, ``10 minutes`` or ``1 hour``."""
    match = _INTERVAL.match(text)
    if not match:
        raise ConfigError(f"not an interval: {text!r} (expected e.g. '5s', '10 minutes')")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def spark_interval(text: str) -> str:
    """The interval in the ``N seconds`` form Spark's watermark and window functions take."""
    seconds = interval_seconds(text)
    if seconds < 1:
        return f"{round(seconds * 1000)} milliseconds"
    return f"{int(seconds)} seconds"


def parse_choices(text: str | None, choices: Sequence[str], what: str) -> list[str]:
    """Comma-separated names from ``choices`` (all of them when ``text`` is empty)."""
    names = [name.strip() for name in (text or ",".join(choices)).split(",") if name.strip()]
    unknown = [name for name in names if name not in choices]
    if unknown or not names:
        raise ConfigError(f"unknown {what} {', '.join(unknown) or '(none)'}: "
                          f"choose from {', '.join(choices)}")
    return names


@dataclass(frozen=True)
class Settings:
    root: Path
    source: str
    kafka_bootstrap_servers: str
    kafka_topic: str
    spark_master: str
    spark_driver_host: str
    spark_java_options: str
    shuffle_partitions: int
    file_listing_parallelism: int
    jars_dir: Path
    trigger_interval: str
    max_files_per_trigger: int
    stall_trigger_intervals: int
    streaming_mode: str
    time_travel_window: str
    vacuum_safety_margin: str
    streaming_schedule: str
    future_tolerance: str
    derive_missing_event_id: bool
    extra_event_time_formats: tuple[str, ...]
    watermark_delay: str
    window_duration: str
    attribution_max_gap: str
    expectations_dir: Path
    quality_source_quiet_after: str
    quality_silver_max_lag: str
    quality_report_days: int
    reprocess_parallel_days: int

    # Layout of the root: one place, so every job and test agrees on it.
    @property
    def landing_events(self) -> Path:
        return self.root / "landing" / "events"

    @property
    def landing_campaigns(self) -> Path:
        return self.root / "landing" / "campaigns"

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"

    @property
    def expected_counts_file(self) -> Path:
        return self.root / "landing" / "expected_counts.json"

    def table_path(self, relative: str) -> str:
        return str(self.tables_dir / relative)

    def checkpoint(self, query_name: str) -> str:
        return str(self.checkpoints_dir / query_name)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} must be true or false, not {value!r}")
    if kind is tuple:  # a TOML list, or comma-separated text from the environment
        items = value.split(",") if isinstance(value, str) else value
        return tuple(str(item).strip() for item in items if str(item).strip())
    if kind is int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be an integer, not {value!r}") from None
    return str(value)


def _field_types() -> dict[str, type]:
    """Each setting's kind, from the dataclass's own type hints: a bool, an int, a tuple of
    strings, or text (paths are text until ``_validated`` resolves them)."""
    hints = typing.get_type_hints(Settings)
    kinds = {name: typing.get_origin(hint) or hint for name, hint in hints.items()}
    return {name: kind if kind in (bool, int, tuple) else str for name, kind in kinds.items()}


def load(overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from defaults, ``LAKEHOUSE_CONFIG``, ``LAKEHOUSE_*`` and ``overrides``."""
    environ = os.environ if environ is None else environ
    types = _field_types()
    values: dict[str, Any] = tomllib.loads(
        resources.files("spark_jobs").joinpath("defaults.toml").read_text("utf-8"))
    if extra := environ.get("LAKEHOUSE_CONFIG"):
        try:
            values.update(tomllib.loads(Path(extra).read_text("utf-8")))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"cannot read LAKEHOUSE_CONFIG={extra}: {error}") from None
    unknown = set(values) - set(types)
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
    for key in types:
        if (env_value := environ.get(f"LAKEHOUSE_{key.upper()}")) is not None:
            values[key] = env_value
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    typed = {key: _coerce(key, values[key], kind) for key, kind in types.items()}
    return _validated(typed)


def _validated(values: dict[str, Any]) -> Settings:
    if values["source"] not in SOURCES:
        raise ConfigError(f"source must be one of {', '.join(SOURCES)}, not {values['source']!r}")
    if values["streaming_mode"] not in STREAMING_MODES:
        raise ConfigError(f"streaming_mode must be one of {', '.join(STREAMING_MODES)}, "
                          f"not {values['streaming_mode']!r}")
    for key in ("shuffle_partitions", "file_listing_parallelism", "max_files_per_trigger",
                "stall_trigger_intervals", "quality_report_days", "reprocess_parallel_days"):
        if values[key] < 1:
            raise ConfigError(f"{key} must be at least 1, not {values[key]}")
    for key in ("trigger_interval", "future_tolerance", "watermark_delay",
                "window_duration", "attribution_max_gap", "time_travel_window",
                "vacuum_safety_margin", "quality_source_quiet_after", "quality_silver_max_lag"):
        interval_seconds(values[key])
    values["root"] = _local_root(values["root"])
    values["jars_dir"] = (Path(values["jars_dir"]).expanduser().resolve() if values["jars_dir"]
                          else default_jars_dir())
    values["expectations_dir"] = (Path(values["expectations_dir"]).expanduser().resolve()
                                  if values["expectations_dir"]
                                  else bundled("expectations"))
    return Settings(**values)


def _local_root(text: str) -> Path:
    """The root as a local folder: a path, or a ``file:`` URI of this machine. An object-store
    URI is refused by name: taken as a path, ``s3a://bucket/lake`` became
    ``<cwd>/s3a:/bucket/lake``, silently."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):/", text)  # two letters: not C:/
    if not scheme:
        return Path(text).expanduser().resolve()
    uri = urllib.parse.urlparse(text)
    if uri.scheme.lower() != "file":
        raise ConfigError(f"root {text}: a {uri.scheme}:// root is not supported yet; the "
                          "landing zone, checkpoint leases and heartbeats need a local folder "
                          "(or a file:// URI)")
    if uri.netloc not in ("", "localhost"):
        raise ConfigError(f"root {text}: a file:// root on another machine ({uri.netloc}) "
                          "is not a local folder")
    return Path(urllib.request.url2pathname(uri.path)).resolve()


def default_jars_dir() -> Path:
    """Where ``make setup`` caches the jars in the checkout; an installed wheel, which has no
    checkout, looks in the user's cache unless ``jars_dir`` says otherwise."""
    if in_checkout():
        return PROJECT_DIR / ".cache" / "jars"
    return Path.home() / ".cache" / "lakehouse" / "jars"
