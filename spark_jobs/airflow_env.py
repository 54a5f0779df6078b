"""The environment Airflow runs the lakehouse in, defined once for ``make``, tests and users.

``lakehouse airflow …`` runs any ``airflow`` command with it: the project's ``dags/`` and
``plugins/`` (the checkout's, or the installed wheel's copies), ``AIRFLOW_HOME`` under the
lakehouse root (SQLite, the embedded default), and the ``lakehouse_spark`` connection on
the configured Spark master. Each is only a default: an ``AIRFLOW_HOME``,
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` (PostgreSQL) or ``AIRFLOW_CONN_LAKEHOUSE_SPARK``
(``spark://master:7077``) already set wins.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import sessionmaker

from spark_jobs import storage
from spark_jobs.config import ConfigError, Settings, bundled

# SQLite, the embedded default, has one writer at a time, and Python's driver gives up after
# 5 s of waiting for the lock ("database is locked"). Beside the scheduler on a busy machine
# the API server then answered a backfill's POST with 503, and the UI submitted it again
# (issue 14: two toasts for one backfill). Its processes wait up to 30 s for the lock instead.
SQLITE_CONNECT_ARGS = {"timeout": 30}


def sqlite_session_maker(engine: Engine) -> sessionmaker:
    """Airflow's session factory (``[database] sql_alchemy_session_maker``), its own
    arguments, with one change on SQLite: a transaction that starts at a savepoint takes the
    write lock first.

    Airflow creates each backfill run inside ``session.begin_nested()``. On SQLite a
    SAVEPOINT outside a transaction begins a deferred one: it reads, then asks for the write
    lock to insert. If the scheduler committed in between, SQLite refuses at once
    (SQLITE_BUSY_SNAPSHOT: the snapshot read is stale), without waiting for the lock at all,
    and the API answered the dialog's backfill with 503 in a tenth of a second (issue 14).
    ``BEGIN IMMEDIATE`` takes the lock before the first read, waiting up to the connection's
    timeout, so the snapshot cannot go stale. Other transactions are left deferred: taking
    the lock for every read would serialise the UI's reads behind the scheduler, and a
    request that holds one session while opening another would wait on itself."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "savepoint", _begin_immediate_before_first_savepoint)
    return sessionmaker(engine, autoflush=False, expire_on_commit=False)


def _begin_immediate_before_first_savepoint(connection: Connection, name: str) -> None:
    if not connection.connection.dbapi_connection.in_transaction:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    named = any(key.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") for key in env)
    if settings.airflow_database == "postgres" and not named:
        from spark_jobs.services import postgres_url

        # The services' PostgreSQL under the root; its password from the file it made.
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = postgres_url(settings)
        named = True
    # The embedded SQLite database: the Airflow home is the project's, and no variable names
    # another database (a user's own home may have PostgreSQL in its airflow.cfg).
    own_home = "AIRFLOW_HOME" not in env
    embedded = own_home and not named
    if own_home and storage.is_object_store(settings.root):
        raise ConfigError(f"Airflow keeps its home on this machine, not under {settings.root}: "
                          f"set AIRFLOW_HOME to a local folder")
    env.setdefault("AIRFLOW_HOME", str(settings.root / "airflow"))
    if own_home:
        from spark_jobs.services import LOGIN_SECRET_VARIABLE, login_secret

        # The login's key, kept under the root, which the Spark daemons' pages check too.
        env[LOGIN_SECRET_VARIABLE] = login_secret(settings, env)
    env.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(bundled("dags")))
    env.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(bundled("plugins")))
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    env.setdefault("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "120")
    if embedded:
        for option in ("SQL_ALCHEMY_CONNECT_ARGS", "SQL_ALCHEMY_CONNECT_ARGS_ASYNC"):
            env.setdefault(f"AIRFLOW__DATABASE__{option}",
                           "spark_jobs.airflow_env.SQLITE_CONNECT_ARGS")
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_SESSION_MAKER",
                       "spark_jobs.airflow_env.sqlite_session_maker")
    env.setdefault("AIRFLOW_CONN_LAKEHOUSE_SPARK",
                   json.dumps({"conn_type": "spark", "host": settings.spark_master}))
    env["LAKEHOUSE_ROOT"] = str(settings.root)
    # spark-submit and airflow of this environment, for the tasks Airflow starts.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
