"""The one configuration of the lakehouse: a typed :class:`Settings` (a pydantic model).

Precedence, lowest first: the packaged ``defaults.toml`` (every key, shipped in the wheel),
an optional TOML file named by ``LAKEHOUSE_CONFIG``, environment variables
``LAKEHOUSE_<KEY>``, then explicit overrides (CLI flags). :func:`load` is the one place that
reads them; everything else receives a :class:`Settings` and nothing reads the environment.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
)

from spark_jobs import storage

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from spark_jobs.storage import LakePath

PROJECT_DIR = Path(__file__).resolve().parent.parent
# The folders the project ships beside its code, and the package each is installed as
# (pyproject.toml maps them into the wheel).
BUNDLED_PACKAGES = {"dags": "lakehouse_dags", "plugins": "lakehouse_plugins",
                    "expectations": "lakehouse_expectations"}
# Where every server the project starts listens unless configured otherwise.
LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = frozenset({"localhost", LOOPBACK, "::1"})
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


def interval_micros(text: str) -> int:
    """Whole microseconds in an interval (``interval_seconds``), as Spark's timestamps count."""
    return round(interval_seconds(text) * 1_000_000)


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


def _interval(text: str, info: ValidationInfo) -> str:
    try:
        interval_seconds(text)
    except ConfigError as error:  # the message names the key, as every other one does
        raise ConfigError(f"{info.field_name}: {error}") from None
    return text


def _jvm_size(text: str, info: ValidationInfo) -> str:
    """A JVM memory size as Spark takes it: a whole number with a unit (512m, 3g)."""
    text = text.strip()
    if not re.fullmatch(r"[1-9][0-9]*[kmgt]", text, re.IGNORECASE):
        raise ConfigError(f"{info.field_name}: {text!r} is not a memory size such as 3g "
                          f"or 3072m")
    return text


def _folder(default: Callable[[], Path]) -> BeforeValidator:
    """A folder setting: a path, or ``default()`` when empty."""
    return BeforeValidator(lambda value: Path(str(value)).expanduser().resolve()
                           if str(value) else default())


def _endpoint(text: str, info: ValidationInfo) -> str:
    """An object store's address: empty (AWS's own), or an http(s) URL with a host."""
    text = text.strip()
    if text:
        address = urllib.parse.urlsplit(text)
        if address.scheme not in ("http", "https") or not address.hostname:
            raise ConfigError(f"{info.field_name}: {text!r} is not an http:// or https:// "
                              f"URL with a host")
        if address.username or address.password:  # it would show in Spark's settings
            raise ConfigError(f"{info.field_name}: no credentials in the URL; the AWS "
                              f"SDK's chain gives them (AWS_ACCESS_KEY_ID, a profile)")
    return text


def _items(value: Any) -> Any:
    """A TOML list, or comma-separated text from the environment."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(str(item).strip() for item in items if str(item).strip())


# Types of the settings. Pydantic parses integers, and booleans from text (1/true/yes/on,
# 0/false/no/off in any case, and t/y/f/n); these add what the lakehouse checks beyond a type.
Count = Annotated[int, Field(ge=1)]
Interval = Annotated[str, AfterValidator(_interval)]
# Stripped first, as the hand-written loader did: pydantic refuses " yes".
Flag = Annotated[bool, BeforeValidator(lambda value: value.strip() if isinstance(value, str)
                                       else value)]


# Strict as the hand-written loader was: no unknown keys, exact key names, a number is text
# where text is expected; immutable (hashable, and no job changes what another reads).
class Settings(BaseModel, frozen=True, extra="forbid", coerce_numbers_to_str=True):
    # Before the root, which needs it when it is on the object store.
    s3_endpoint: Annotated[str, AfterValidator(_endpoint)]
    root: Annotated[Any, BeforeValidator(lambda value, info: _root(value, info))]
    source: Literal["files", "kafka"]
    kafka_bootstrap_servers: str
    kafka_topic: str
    kafka_partitions: Count
    kafka_max_offsets_per_trigger: Count
    kafka_fail_on_data_loss: Flag
    postgres_port: Count
    airflow_database: Literal["sqlite", "postgres"]
    spark_master: str
    spark_driver_host: str
    executor_python: str
    spark_java_options: str
    spark_driver_memory: Annotated[str, AfterValidator(_jvm_size)]
    shuffle_partitions: Count
    file_listing_parallelism: Count
    delta_snapshot_partitions: Count
    jars_dir: Annotated[Path, _folder(lambda: default_jars_dir())]
    trigger_interval: Interval
    table_poll_interval: Interval
    max_files_per_trigger: Count
    landing_cleanup: Literal["archive", "delete", "off"]
    stall_trigger_intervals: Count
    streaming_mode: Literal["continuous", "scheduled"]
    time_travel_window: Interval
    vacuum_safety_margin: Interval
    streaming_schedule: str
    future_tolerance: Interval
    derive_missing_event_id: Flag
    purchase_requires_price: Flag
    extra_event_time_formats: Annotated[tuple[str, ...], BeforeValidator(_items)]
    watermark_delay: Interval
    window_duration: Interval
    attribution_max_gap: Interval
    attribution_trigger: Interval
    session_gap: Interval
    sessions_trigger: Interval
    alert_clicks_per_minute: Count
    alert_watermark_delay: Interval
    alert_trigger: Interval
    alert_topic: str
    expectations_dir: Annotated[Path, _folder(lambda: bundled("expectations"))]
    quality_source_quiet_after: Interval
    quality_silver_max_lag: Interval
    quality_report_days: Count
    reprocess_parallel_days: Count

    # Layout of the root: one place, so every job and test agrees on it.
    @property
    def landing_dir(self) -> Path:
        """The file landing zone: events, campaign mappings, the generator's expected
        counts."""
        return self.root / "landing"

    @property
    def landing_events(self) -> Path:
        return self.landing_dir / "events"

    @property
    def landing_campaigns(self) -> Path:
        return self.landing_dir / "campaigns"

    @property
    def landing_archive(self) -> Path:
        """Where bronze moves the landing zone's event files it has ingested
        (``landing_cleanup = "archive"``), each under its own path."""
        return self.landing_dir / "archive"

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
        return self.landing_dir / "expected_counts.json"

    def table_path(self, relative: str) -> str:
        return str(self.tables_dir / relative)

    @property
    def services_dir(self) -> Path:
        """The services' data and logs: on this machine, under a local root."""
        if storage.is_object_store(self.root):
            raise ConfigError(f"the services keep their data on this machine, not under "
                              f"{self.root}: run lakehouse services with a local --root")
        return self.root / "services"

    @property
    def kafka_broker_jars(self) -> Path:
        return self.jars_dir / "kafka-broker"

    def checkpoint(self, query_name: str) -> str:
        return str(self.checkpoints_dir / query_name)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes``, validated as a loaded one is."""
        return _checked(lambda: Settings(**(dict(self) | changes)))


def load(overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from defaults, ``LAKEHOUSE_CONFIG``, ``LAKEHOUSE_*`` and ``overrides``."""
    environ = os.environ if environ is None else environ
    values = _toml(resources.files("spark_jobs").joinpath("defaults.toml").read_text("utf-8"),
                   "the packaged defaults.toml")
    if extra := environ.get("LAKEHOUSE_CONFIG"):
        try:
            text = Path(extra).expanduser().read_text("utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read LAKEHOUSE_CONFIG={extra}: {error}") from None
        values |= _toml(text, f"LAKEHOUSE_CONFIG={extra}")
    values |= {key: value for key in Settings.model_fields
               if (value := environ.get(f"LAKEHOUSE_{key.upper()}")) is not None}
    values |= {key: value for key, value in (overrides or {}).items() if value is not None}
    settings = _checked(lambda: Settings(**values))
    # The object store the project's own files go to, for this process (``storage``).
    storage.configure(settings.s3_endpoint)
    return settings


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"cannot read {source}: {error}") from None


def _checked(build: Callable[[], Settings]) -> Settings:
    """``build()``, its validation errors as one :class:`ConfigError` line naming each key."""
    try:
        return build()
    except ValidationError as invalid:
        errors = invalid.errors()
    unknown = [str(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden"]
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
    raise ConfigError("; ".join(_reason(error) for error in errors))


# What a failed check means, for the types the settings use; any other says pydantic's words.
_REASONS = {
    "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "int_type": "must be an integer", "greater_than_equal": "must be at least {ge}",
    "bool_parsing": "must be true or false", "bool_type": "must be true or false",
    "literal_error": "must be one of {expected}",
}


def _reason(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "value_error":  # a ConfigError of this module, naming the key
        return str(error["ctx"]["error"])
    if error["type"] == "missing":
        return f"{key} is not set"
    reason = (_REASONS[error["type"]].format(**error.get("ctx", {}))
              if error["type"] in _REASONS else error["msg"])
    return f"{key} {reason}, not {error['input']!r}"


def _root(value: object, info: ValidationInfo) -> LakePath:
    """The root: a local folder (a path, or a ``file:`` URI of this machine), or a folder
    of a bucket on the object store (``s3a://bucket/folder``, kept as the URI: taken as a
    path it became ``<cwd>/s3a:/bucket/folder``, silently). An empty or missing one is
    refused (it became the working folder, or a folder named "None")."""
    text = "" if value is None else str(value)
    if not text.strip():
        raise ConfigError("root is empty: name the lakehouse's folder (--root, "
                          "LAKEHOUSE_ROOT or root in the configuration file)")
    if storage.is_object_store(text):
        address = urllib.parse.urlsplit(text)
        if not address.hostname:
            raise ConfigError(f"root {text}: name the bucket (s3a://bucket/folder)")
        if address.username or address.password:  # it would show in logs and settings
            raise ConfigError("root: no credentials in the URI; the AWS SDK's chain gives "
                              "them (AWS_ACCESS_KEY_ID, a profile)")
        return storage.lake_path(text.rstrip("/"), endpoint=info.data.get("s3_endpoint", ""))
    return _local_root(text)


def _local_root(text: str) -> Path:
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):/", text)  # two letters: not C:/
    if not scheme:
        return Path(text).expanduser().resolve()
    uri = urllib.parse.urlparse(text)
    if uri.scheme.lower() == storage.OBJECT_STORE_SCHEME:
        raise ConfigError(f"root {text}: write it as {storage.OBJECT_STORE_SCHEME}://bucket/"
                          f"folder")
    if uri.scheme.lower() != "file":
        raise ConfigError(f"root {text}: a {uri.scheme}:// root is not supported: a local "
                          f"folder, a file:// URI or an {storage.OBJECT_STORE_SCHEME}:// URI")
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
