"""The environment Airflow runs the lakehouse in, defined once for ``make``, tests and users.

``lakehouse airflow …`` runs any ``airflow`` command with it: the project's ``dags/`` and
``plugins/``, ``AIRFLOW_HOME`` under the lakehouse root (SQLite, the embedded default), and
the ``lakehouse_spark`` connection on the configured Spark master. Each is only a default:
an ``AIRFLOW_HOME``, ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` (PostgreSQL) or
``AIRFLOW_CONN_LAKEHOUSE_SPARK`` (``spark://master:7077``) already set wins.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from spark_jobs.config import PROJECT_DIR, Settings

# SQLite, the embedded default, has one writer at a time, and Python's driver gives up after
# 5 s of waiting for the lock ("database is locked"). Beside the scheduler on a busy machine
# the API server then answered a backfill's POST with 503, and the UI submitted it again
# (issue 14: two toasts for one backfill). Its processes wait up to 30 s for the lock instead.
SQLITE_CONNECT_ARGS = {"timeout": 30}


def environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # The embedded SQLite database: the Airflow home is the project's, and no variable names
    # another database (a user's own home may have PostgreSQL in its airflow.cfg).
    embedded = "AIRFLOW_HOME" not in env and not any(
        key.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") for key in env)
    env.setdefault("AIRFLOW_HOME", str(settings.root / "airflow"))
    env.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_DIR / "dags"))
    env.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(PROJECT_DIR / "plugins"))
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    env.setdefault("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "120")
    if embedded:
        for option in ("SQL_ALCHEMY_CONNECT_ARGS", "SQL_ALCHEMY_CONNECT_ARGS_ASYNC"):
            env.setdefault(f"AIRFLOW__DATABASE__{option}",
                           "spark_jobs.airflow_env.SQLITE_CONNECT_ARGS")
    env.setdefault("AIRFLOW_CONN_LAKEHOUSE_SPARK",
                   json.dumps({"conn_type": "spark", "host": settings.spark_master}))
    env["LAKEHOUSE_ROOT"] = str(settings.root)
    # spark-submit and airflow of this environment, for the tasks Airflow starts.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
