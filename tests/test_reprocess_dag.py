"""The ``lakehouse_reprocess`` DAG as Airflow's UI, backfill and task runner see it.

One subprocess (Airflow configures itself from the environment at import, so it runs
with the lakehouse's Airflow environment, as ``tests/test_airflow.py`` does) loads the DAG
through a ``DagBag`` and reports, per case: the runtime's param validation
(``process_params``, what a triggered run's task does), the backfill's validation
(``deep_merge(...).validate()`` on the serialized DAG, what ``POST /api/v2/backfills``
does), which params the UI form would treat as required, and the rendered ``--from`` and
``--to`` of the rebuild task. No scheduler, no Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.airflow_env import environment
from spark_jobs.config import PROJECT_DIR
from tests.conftest import cli_env, make_settings

pytestmark = pytest.mark.integration

REPORT = """
import json, sys
from datetime import datetime
from types import SimpleNamespace

from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions.param import process_params
from airflow.serialization.serialized_objects import DagSerialization

cases = json.loads(sys.argv[2])
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags["lakehouse_reprocess"]
task = dag.get_task("rebuild_dates")
served = DagSerialization.from_dict(DagSerialization.to_dict(dag))


def validated(conf):
    # A task process resolves its params once, and resolving stores the value in the
    # DAG's and the task's Param objects (a deepcopy of the DAG shares the task's), so each
    # case parses its own DAG.
    fresh = DagBag(dag_folder=sys.argv[1]).dags["lakehouse_reprocess"]
    return process_params(fresh, fresh.get_task("rebuild_dates"), conf,
                          suppress_exception=False)


def outcome(check):
    try:
        return {"ok": check()}
    except Exception as error:
        return {"error": str(error)}


def ui_field(param):
    # The UI's rules (components/FlexibleForm/isParamRequired.tsx, FieldSelector.tsx,
    # FlexibleForm.tsx): a typed param is required unless its type list holds "null", and
    # a required param whose value is null or "" keeps Trigger / Run Backfill disabled.
    kind = param.schema.get("type")
    required = bool(kind) and not (isinstance(kind, list) and "null" in kind)
    shown = ([t for t in kind if t != "null"] or ["string"])[0] if isinstance(kind, list) else kind
    return {"required": required, "blocks_form": required and param.value in (None, ""),
            "date_picker": shown == "string" and param.schema.get("format") == "date"}


def rendered(case):
    run = case["dag_run"]
    dag_run = SimpleNamespace(
        data_interval_start=run["data_interval_start"] and datetime.fromisoformat(
            run["data_interval_start"]),
        run_after=datetime.fromisoformat(run["run_after"]), run_type=run["run_type"])
    context = {"params": validated(case["conf"]), "dag_run": dag_run}
    if dag_run.data_interval_start:  # the task runner's context has it only then
        context["data_interval_start"] = dag_run.data_interval_start
    args = task.render_template(task.application_args, context)
    return {"from": args[args.index("--from") + 1], "to": args[args.index("--to") + 1],
            "late": "--late" in args}


print(json.dumps({
    "errors": {path: str(error) for path, error in bag.import_errors.items()},
    "display_name": task.task_display_name,
    "tasks": sorted(served.task_ids),
    "ui": {name: ui_field(served.params.get_param(name)) for name in served.params},
    "trigger": [outcome(lambda conf=conf: validated(conf)) for conf in cases["confs"]],
    "backfill": [outcome(lambda conf=conf: served.params.deep_merge(conf).validate())
                 for conf in cases["confs"]],
    "rendered": [outcome(lambda case=case: rendered(case)) for case in cases["renders"]],
}))
"""

# What the UI's forms send with nothing typed (an emptied field is sent as null), what
# `airflow backfill create` and a bare REST call send, and explicit dates.
EMPTY_CONFS = [
    {},
    {"from": None, "to": None},
    {"from": None, "to": None, "layers": "silver,gold", "quarantine": False},
]
BAD_CONFS = [
    {"from": "21/11/2026"},
    {"to": "2026-02-30"},
]
CONFS = [*EMPTY_CONFS, {"from": "2026-11-01", "to": "2026-11-03"}, *BAD_CONFS]

NIGHTLY = {"data_interval_start": "2026-11-04T00:00:00+00:00",
           "run_after": "2026-11-05T00:00:00+00:00", "run_type": "scheduled"}
BACKFILL = NIGHTLY | {"run_type": "backfill"}
# Airflow 3 lets a manual run have no logical date, hence no data interval.
NO_INTERVAL = {"data_interval_start": None, "run_after": "2026-11-05T10:30:00+00:00",
               "run_type": "manual"}
RENDERS = [
    *({"conf": conf, "dag_run": NIGHTLY} for conf in EMPTY_CONFS),
    {"conf": {}, "dag_run": BACKFILL},
    {"conf": {}, "dag_run": NO_INTERVAL},
    {"conf": {"from": "2026-11-01", "to": "2026-11-03"}, "dag_run": NIGHTLY},
    {"conf": {"from": "2026-11-01"}, "dag_run": NIGHTLY},
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root: Path = tmp_path_factory.mktemp("reprocess-dag") / "lake"
    done = subprocess.run(
        [sys.executable, "-c", REPORT, str(PROJECT_DIR / "dags" / "lakehouse_reprocess.py"),
         json.dumps({"confs": CONFS, "renders": RENDERS})],
        env=environment(make_settings(root), cli_env()), capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    return result


def test_no_param_is_required_in_the_ui_and_the_dates_get_a_date_picker(report) -> None:
    assert set(report["ui"]) == {"from", "to", "layers", "quarantine"}
    assert not any(field["blocks_form"] for field in report["ui"].values()), report["ui"]
    assert not report["ui"]["from"]["required"] and not report["ui"]["to"]["required"]
    assert report["ui"]["from"]["date_picker"] and report["ui"]["to"]["date_picker"]


def test_empty_confs_pass_the_trigger_and_the_backfill_validation(report) -> None:
    for conf, trigger, backfill in zip(CONFS, report["trigger"], report["backfill"],
                                       strict=True):
        if conf in BAD_CONFS:
            continue
        assert "ok" in trigger, (conf, trigger)
        assert "ok" in backfill, (conf, backfill)
    assert report["trigger"][0]["ok"] == {"from": None, "to": None, "layers": "silver,gold",
                                          "quarantine": False}


def test_a_bad_date_is_refused_naming_the_param(report) -> None:
    outcomes = dict(zip(map(json.dumps, CONFS), zip(report["trigger"], report["backfill"],
                                                    strict=True), strict=True))
    for conf in BAD_CONFS:
        name = next(iter(conf))
        for outcome in outcomes[json.dumps(conf)]:
            assert f"Invalid input for param {name}" in outcome.get("error", ""), (conf,
                                                                                 outcome)


def test_an_empty_range_rebuilds_exactly_the_runs_day(report) -> None:
    day = {"from": "2026-11-04", "to": "2026-11-04"}
    *nightly, backfill, no_interval, explicit, from_only = report["rendered"]
    # The nightly run alone also repairs the late-data ledger's dates (in the same
    # spark-submit: no second task); a backfill or manual run rebuilds its days only.
    assert nightly == [{"ok": day | {"late": True}}] * len(EMPTY_CONFS)
    assert backfill == {"ok": day | {"late": False}}
    # No data interval: the day before the run, the last complete day.
    assert no_interval == {"ok": day | {"late": False}}
    assert explicit == {"ok": {"from": "2026-11-01", "to": "2026-11-03", "late": True}}
    assert from_only == {"ok": {"from": "2026-11-01", "to": "2026-11-04", "late": True}}


def test_the_rebuild_task_says_what_it_rebuilds(report) -> None:
    assert report["display_name"] == "rebuild the run's day (or from..to)"
    assert report["tasks"] == [
        "quarantine_requested", "rebuild_dates", "replay_quarantine"]
