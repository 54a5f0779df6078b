"""``lakehouse reset LAYER``: the runbook for a change a stream's checkpoint cannot carry.

A stateful stream refuses to resume on state built under other logic (``checkpoints``).
Reset rebuilds the layer under the logic now configured, exactly:

1. it takes the leases of the layer and of the layers that read it (silver's reset
   rebuilds gold too: gold's checkpoints point at silver's versions), so no stream of
   them runs meanwhile, and leaves a marker that keeps their streams from starting on a
   half-reset layer;
2. deletes the layers' checkpoints and the rows of their tables (Delta keeps the old
   versions for time travel until VACUUM), and for gold the record of earlier rebuilds;
3. replays the layers' streams from the start of their sources (``--available-now``):
   silver judges every bronze record again, and each event's row is then its first
   delivery (``adopt_first_deliveries``); gold counts every silver event again;
4. rebuilds gold for every event date of silver, so what the replay's batches found late
   is counted too and gold equals the batch recomputation; the ledger's entries for those
   dates are marked repaired;
5. removes the marker. Interrupted anywhere, running it again starts over from step 1.

Bronze has no reset: it is the record of what was delivered, and its landing files are
remembered by path, not kept for a second reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from spark_jobs import checkpoints, registry, storage, streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import ConfigError, Settings
from spark_jobs.datasets import TABLES as DATASETS
from spark_jobs.ops import gold_rebuilds
from spark_jobs.ops.leases import REPROCESS, leases
from spark_jobs.silver import ad_events as silver
from spark_jobs.storage import lake_path
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A layer, and every layer its reset rebuilds, in dependency order.
RESETS: dict[str, tuple[str, ...]] = {"silver": ("silver", "gold"), "gold": ("gold",),
                                      "ops": ("ops",)}
# The tables each layer's streams write (gold's record of rebuilds goes with gold: it
# tells the gold streams which silver rows a rebuild counted in tables now emptied).
TABLES: dict[str, tuple[TableSpec, ...]] = {
    layer: (*(DATASETS[table.name] for table in registry.TABLES.values()
              if table.stream and table.layer == layer),
            *((gold_rebuilds.TABLE,) if layer == "gold" else ()))
    for layer in RESETS}


@dataclass(frozen=True)
class ResetOutcome:
    layers: tuple[str, ...]
    rows: dict[str, int]  # table -> rows after the reset
    event_dates: tuple[str, str] | None  # the range gold was rebuilt for
    seconds: float


def layers_reset_by(layer: str) -> tuple[str, ...]:
    """The layers a reset of ``layer`` rebuilds; a clear error for one it cannot reset."""
    if layer not in RESETS:
        raise ConfigError(f"cannot reset {layer!r}: choose from {', '.join(RESETS)} (bronze "
                          f"is the record of deliveries, rebuilt by nothing)")
    return RESETS[layer]


def reset(spark: SparkSession, settings: Settings, layer: str) -> ResetOutcome:
    """Rebuild ``layer`` (and the layers that read it) from its sources, under the settings
    now configured. Raises ``LeaseHeld`` while a driver streams any of them."""
    from spark_jobs.dates import DateRange
    from spark_jobs.reprocess import rebuild_gold

    layers = layers_reset_by(layer)
    started = datetime.now(UTC)
    with leases(settings, layers, purpose=REPROCESS):
        for reset_layer in layers:  # kept until the end: a half-reset layer stays shut
            checkpoints.mark_reset(settings, reset_layer, layer, started.isoformat())
        for reset_layer in layers:
            _forget(spark, settings, reset_layer)
        for reset_layer in layers:
            streaming.catch_up(spark, settings, [reset_layer])
            if reset_layer == "silver":
                adopt_first_deliveries(spark, settings)

        dates = None  # the range gold was rebuilt for
        if "gold" in layers:
            dates = (read_table(spark, settings, silver.TABLE)
                     .agg(F.min("event_date").alias("first"), F.max("event_date").alias("last"))
                     .first())
            if dates.first is None:
                dates = None
            else:
                rebuild_gold(spark, settings, DateRange(dates.first, dates.last),
                             dry_run=False)
        rows = {spec.name: read_table(spark, settings, spec).count()
                for reset_layer in layers for spec in TABLES[reset_layer]}
        for reset_layer in layers:
            checkpoints.reset_marker(settings, reset_layer).unlink(missing_ok=True)
    return ResetOutcome(layers, rows,
                        None if dates is None else (str(dates.first), str(dates.last)),
                        round((datetime.now(UTC) - started).total_seconds(), 1))


def adopt_first_deliveries(spark: SparkSession, settings: Settings) -> None:
    """Each event's row from its first delivery, whatever order the replay read bronze in.
    A stream without a checkpoint starts from bronze's current snapshot, ordered by when
    its files were written, and OPTIMIZE rewrites old records into new files: a
    redelivery in a file it left alone could be read, and inserted, first."""
    from spark_jobs.silver.validation import Rules, validate

    bronze_rows = read_table(spark, settings, bronze.TABLE)
    events = silver.first_deliveries(silver.accepted(
        validate(bronze_rows, Rules.from_settings(settings))))
    silver.adopt_earlier_deliveries(spark, settings, events)


def _forget(spark: SparkSession, settings: Settings, layer: str) -> None:
    """The layer's checkpoints deleted and its tables emptied (each step repeatable)."""
    from delta.tables import DeltaTable

    # The state stores of this JVM's stopped queries are unloaded first: their background
    # maintenance (RocksDB's snapshot upload) could otherwise write an old query's state
    # into the checkpoint after it was deleted, where the new query would find it.
    spark.sparkContext._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    for query_name in registry.query_names(layer):
        storage.remove_tree(lake_path(settings.checkpoint(query_name)))
    for spec in TABLES[layer]:
        ensure_table(spark, settings, spec)
        DeltaTable.forPath(spark, spec.path(settings)).delete()
