"""A Python worker's input to ``transformWithStateInPandas``, read by key a slice at a time.

PySpark 4.2's reader of that input (``TransformWithStateInPandasSerializer.load_stream``)
turns every Arrow batch into pandas, walks it row by row (``itertuples``, a key tuple per
row) and builds each key's frame again from those rows (``pd.DataFrame(rows)``): for the
bench's 934,000 silver events, most of what the sessions stream's stateful step costs in
Python beside the processor itself. The JVM sends a key's rows next to each other, so the
same frames are slices of each batch, cut where the key changes. ``install`` puts this
reader in place of PySpark's within a Python worker: the sessions processor calls it when
it is unpickled there (``user_sessions``), before the worker reads its input.

What the processor receives is what PySpark's reader gives, key by key and in the same
order: a frame per run of one key within an Arrow batch (never larger than a batch, so
``spark.sql.execution.arrow.maxRecordsPerBatch`` still bounds it), its columns by name,
with the dtypes Arrow's conversion gives (PySpark's reader infers them again from the
rows, which gives the same for the sessions' integers and strings).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any

# The PySpark release whose reader this replaces (its arguments and the modes it yields);
# under another, PySpark's own stays.
PYSPARK_RELEASE = "4.2."


def key_runs(frame: Any, key_offsets: list[int]) -> Iterator[tuple[tuple, Any]]:
    """``frame``'s rows as (key, rows) per run of consecutive rows sharing a key, where
    the key is the columns at ``key_offsets`` as PySpark's reader makes it."""
    import numpy as np

    rows = len(frame)
    if not rows:
        return
    starts_run = np.zeros(rows, dtype=bool)
    starts_run[0] = True
    keys = [frame.iloc[:, offset].to_numpy() for offset in key_offsets]
    for column in keys:
        starts_run[1:] |= column[1:] != column[:-1]
    bounds = [*np.flatnonzero(starts_run).tolist(), rows]
    for start, end in zip(bounds, bounds[1:], strict=False):
        key = tuple(frame.iat[start, offset] for offset in key_offsets)
        yield key, frame.iloc[start:end].reset_index(drop=True)


def _load_stream(self: Any, stream: Any) -> Iterator[tuple[Any, Any, Any]]:
    import pandas as pd
    from pyspark.sql.pandas.serializers import ArrowBatchTransformer, ArrowStreamPandasSerializer
    from pyspark.sql.streaming.stateful_processor_util import (
        TransformWithStateInPandasFuncMode as Mode,
    )

    def runs() -> Iterator[tuple[tuple, pd.DataFrame]]:
        # The Arrow batches as PySpark's reader takes them (its grandparent's reader).
        for batch in super(ArrowStreamPandasSerializer, self).load_stream(stream):
            self._update_batch_size_stats(batch)
            columns = ArrowBatchTransformer.to_pandas(
                batch, timezone=self._timezone, schema=self._input_type,
                struct_in_pandas=self._struct_in_pandas, ndarray_as_list=self._ndarray_as_list,
                prefer_int_ext_dtype=self._prefer_int_ext_dtype,
                df_for_struct=self._df_for_struct)
            yield from key_runs(pd.concat(columns, axis=1), self.key_offsets)

    # A key's rows may go on in the next batch: its runs are one group.
    for key, group in groupby(runs(), key=itemgetter(0)):
        yield Mode.PROCESS_DATA, key, group
    yield Mode.PROCESS_TIMER, None, None
    yield Mode.COMPLETE, None, None


def install() -> bool:
    """This reader in place of PySpark's in this process, when PySpark is the release it
    was written for; whether it is."""
    import pyspark
    from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

    if not pyspark.__version__.startswith(PYSPARK_RELEASE):
        return False
    TransformWithStateInPandasSerializer.load_stream = _load_stream
    return True
