"""``lakehouse_job``: a ``lakehouse`` verb run as a submitted Spark application.

Every job is the project's CLI (``spark_jobs/cli.py``, wherever the package is installed)
submitted with the official ``SparkSubmitOperator`` against the ``lakehouse_spark``
connection: ``local[*]`` on a laptop, ``spark://master:7077`` for a cluster. The Delta jars
and every Spark setting come from ``spark_jobs.session.spark_conf``, the one place they are
defined.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from spark_jobs import config, registry

SPARK_CONNECTION = "lakehouse_spark"
# The file, found without importing it (the CLI's imports are not for DAG parsing).
CLI = importlib.util.find_spec("spark_jobs.cli").origin


def lakehouse_job(task_id: str, verb: str, *args: str,
                  execution_timeout: timedelta = timedelta(hours=2),
                  **operator_args: Any) -> SparkSubmitOperator:
    """``lakehouse <verb> <args…>`` as a Spark application (args may be Jinja templates)."""
    from spark_jobs.session import spark_conf

    settings = config.load()
    conf = spark_conf(settings)
    jars = conf.pop("spark.jars")
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONNECTION,
        application=CLI,
        application_args=[verb, *args],
        name=f"lakehouse-{task_id}",
        jars=jars,
        conf=conf,
        # The driver is this environment's Python, which has the project installed.
        env_vars={"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        execution_timeout=execution_timeout,
        **operator_args,
    )


def assets(*names: str) -> list[Any]:
    """The Airflow assets of the registry's tables by name (``silver.ad_events``), as
    ``file://`` URIs."""
    from airflow.sdk import Asset

    settings = config.load()
    return [Asset(name=name, uri=f"file://{registry.TABLES[name].path(settings)}")
            for name in names]


def is_true(rendered_flag: str) -> bool:
    """A boolean param as a template renders it ("True"/"False")."""
    return rendered_flag.strip().lower() == "true"
