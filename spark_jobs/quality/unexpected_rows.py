"""The suites' unexpected-rows queries, each run once on Spark instead of twice.

Great Expectations 1.x resolves an ``UnexpectedRowsExpectation`` from two metrics, the
query's rows (at most ``MAX_RESULT_RECORDS``) and the query's row count, and on Spark each
runs the query as its own job: ``collect`` of the rows, then ``count``. The queries are
small jobs over cached snapshots, so their fixed costs (planning, scheduling, a shuffle)
are what a validation pays: the suites' 13 such queries took 13.6 s of a 54 s validation.

Importing this module registers Spark implementations of both metrics that share one run
of the query, a metric of their own that Great Expectations resolves once per query: the
rows, one past the limit, so a count is run only when more than the limit came back. Both
metrics keep Great Expectations' values (the rows up to the limit, the exact count), so
the expectations, their results and Data Docs are what they were. Other engines keep
Great Expectations' own implementations.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from great_expectations.constants import MAX_RESULT_RECORDS
from great_expectations.core.metric_domain_types import MetricDomainTypes
from great_expectations.execution_engine import SparkDFExecutionEngine
from great_expectations.expectations.metrics.metric_provider import metric_value
from great_expectations.expectations.metrics.query_metric_provider import QueryMetricProvider
from great_expectations.expectations.metrics.query_metrics.query_row_count import (
    unexpected_rows_query_row_count as gx_row_count,
)
from great_expectations.expectations.metrics.query_metrics.query_table import (
    unexpected_rows_query_table as gx_table,
)
from great_expectations.validator.metric_configuration import MetricConfiguration

if TYPE_CHECKING:
    from collections.abc import Iterator

ROWS_PAST_LIMIT = "lakehouse.unexpected_rows_query.rows_past_limit"


@contextmanager
def _replacing_quietly() -> Iterator[None]:
    """Great Expectations warns when a metric's provider is replaced: here on purpose."""
    registry = logging.getLogger("great_expectations.expectations.registry")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        yield
    finally:
        registry.setLevel(level)


class UnexpectedRowsPastLimit(QueryMetricProvider):
    """The query's rows, at most one more than Great Expectations keeps: one Spark job."""

    metric_name = ROWS_PAST_LIMIT
    value_keys = ("unexpected_rows_query",)
    query_param_name: ClassVar[str] = "unexpected_rows_query"

    @metric_value(engine=SparkDFExecutionEngine)
    def _spark(cls, execution_engine: SparkDFExecutionEngine, metric_domain_kwargs: dict,
               metric_value_kwargs: dict, metrics: dict[str, Any],
               runtime_configuration: dict) -> list[dict[str, Any]]:
        query = cls._get_query_from_metric_value_kwargs(metric_value_kwargs)
        frame, _, _ = execution_engine.get_compute_domain(
            metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE)
        frame.createOrReplaceTempView("tmp_view")  # the view Great Expectations' own uses
        rows = execution_engine.spark.sql(cls._format_query(query, batch="tmp_view"))
        return [row.asDict() for row in rows.limit(MAX_RESULT_RECORDS + 1).collect()]


class _SharingRowsPastLimit:
    """Makes a metric of the query depend on the query's rows, resolved once for both."""

    @classmethod
    def _get_evaluation_dependencies(cls, metric: MetricConfiguration,
                                     *args: Any, **kwargs: Any
                                     ) -> dict[str, MetricConfiguration]:
        rows = MetricConfiguration(ROWS_PAST_LIMIT, metric.metric_domain_kwargs,
                                   metric.metric_value_kwargs)
        return {**super()._get_evaluation_dependencies(metric, *args, **kwargs),  # type: ignore[misc]
                ROWS_PAST_LIMIT: rows}


with _replacing_quietly():

    class UnexpectedRowsTable(_SharingRowsPastLimit, gx_table.UnexpectedRowsQueryTable):
        """``unexpected_rows_query.table`` on Spark: the shared rows, up to the limit."""

        @metric_value(engine=SparkDFExecutionEngine)
        def _spark(cls, execution_engine: SparkDFExecutionEngine, metric_domain_kwargs: dict,
                   metric_value_kwargs: dict, metrics: dict[str, Any],
                   runtime_configuration: dict) -> list[dict[str, Any]]:
            return metrics[ROWS_PAST_LIMIT][:MAX_RESULT_RECORDS]

    class UnexpectedRowsCount(_SharingRowsPastLimit,
                              gx_row_count.UnexpectedRowsQueryRowCount):
        """``unexpected_rows_query.row_count`` on Spark: the shared rows counted, and the
        query counted by Spark only when they reached past the limit."""

        @metric_value(engine=SparkDFExecutionEngine)
        def _spark(cls, execution_engine: SparkDFExecutionEngine, metric_domain_kwargs: dict,
                   metric_value_kwargs: dict, metrics: dict[str, Any],
                   runtime_configuration: dict) -> int:
            rows = metrics[ROWS_PAST_LIMIT]
            if len(rows) <= MAX_RESULT_RECORDS:
                return len(rows)
            # Great Expectations' own count, the whole query counted
            return gx_row_count.UnexpectedRowsQueryRowCount._spark(
                cls, execution_engine, metric_domain_kwargs, metric_value_kwargs, metrics,
                runtime_configuration)
