"""``lakehouse_job``: a ``lakehouse`` verb run as a submitted Spark application.

Every job is the project's CLI (``spark_jobs/cli.py``, wherever the package is installed)
submitted with the official ``SparkSubmitOperator`` against the ``lakehouse_spark``
connection: ``local[*]`` on a laptop, ``spark://master:7077`` for a cluster. The Delta jars
and every Spark setting come from ``spark_jobs.session.spark_conf``, the one place they are
defined, read where and when the task runs: a DAG file holds only the DAG's shape, so the
DAG processor needs neither the jar cache nor the data root, and each worker submits with
its own interpreter, jars and paths.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from spark_jobs import config

SPARK_CONNECTION = "lakehouse_spark"


class LakehouseJob(SparkSubmitOperator):
    """``lakehouse <verb> <args…>`` as a Spark application; what depends on the machine is
    resolved in ``execute``, on the worker."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        # Resolved on the worker before rendering: the task's Rendered Templates then show
        # what was submitted (the CLI's file, the jars, every Spark setting).
        self.resolve()
        super().render_template_fields(context, jinja_env)

    def execute(self, context: Any) -> Any:
        if not self.application:  # run without rendering (a direct call)
            self.resolve()
        return super().execute(context)

    def resolve(self) -> None:
        """This machine's submission: the installed CLI, its Python, the jars and every
        Spark setting."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from spark_jobs.session import spark_conf

        # The master spark-submit will be given is the connection's, which a user may have
        # set apart from the settings (in Airflow's connections or AIRFLOW_CONN_*): what is
        # shipped and where the driver listens follow it, not the setting.
        master = SparkSubmitHook(conn_id=self._conn_id)._connection["master"]
        settings = config.load()
        if master != settings.spark_master:
            settings = settings.replace(spark_master=master)
        conf = spark_conf(settings)
        # None for a local master, whose driver has the jars on its class path.
        self.jars = conf.pop("spark.jars", None)
        # A cluster's executors get the project's code as spark-submit's --py-files.
        self.py_files = conf.pop("spark.submit.pyFiles", None)
        self.conf = conf
        # The file, found without importing it (the CLI's imports are not for a worker's
        # process); the driver is this environment's Python, which has the project installed.
        self.application = importlib.util.find_spec("spark_jobs.cli").origin
        # The shipped zip also comes first on the driver's path, and a package imported
        # from a zip cannot tell where its checkout is: the folders found here go along.
        self.env_vars = {"PYSPARK_PYTHON": conf["spark.pyspark.python"],
                         "PYSPARK_DRIVER_PYTHON": sys.executable,
                         "LAKEHOUSE_JARS_DIR": str(settings.jars_dir),
                         "LAKEHOUSE_EXPECTATIONS_DIR": str(settings.expectations_dir)}


def lakehouse_job(task_id: str, verb: str, *args: str,
                  execution_timeout: timedelta = timedelta(hours=2),
                  **operator_args: Any) -> LakehouseJob:
    """``lakehouse <verb> <args…>`` as a Spark application (args may be Jinja templates)."""
    if resolved := {"application", "conf", "jars", "env_vars"} & operator_args.keys():
        raise TypeError(f"{task_id}: {', '.join(sorted(resolved))} come from the settings "
                        "where the task runs (spark_jobs.session.spark_conf)")
    return LakehouseJob(
        task_id=task_id,
        conn_id=SPARK_CONNECTION,
        application="",  # the installed CLI, found when the task runs
        application_args=[verb, *args],
        name=f"lakehouse-{task_id}",
        execution_timeout=execution_timeout,
        **operator_args,
    )


def assets(*names: str) -> list[Any]:
    """The Airflow assets of the registry's tables by name (``silver.ad_events``). Their URIs
    name the table, not where it lies (``lakehouse://silver.ad_events``): the parsing host
    does not know the workers' root."""
    from airflow.sdk import Asset

    from spark_jobs import registry

    return [Asset(name=name, uri=f"lakehouse://{registry.TABLES[name].name}") for name in names]


def is_true(rendered_flag: str) -> bool:
    """A boolean param as a template renders it ("True"/"False")."""
    return rendered_flag.strip().lower() == "true"
