"""The lakehouse installed from its wheel, outside the checkout: what a cluster node or the
Docker image runs (issue 17).

The wheel is built from a copy of the checkout's sources and installed into a fresh virtual
environment without its dependencies; those are this environment's packages, linked in
with a ``.pth`` file rather than downloaded again (the test is about what the wheel carries,
not about PyPI). Every command then runs in a folder outside the checkout, so nothing can
be found there by accident.
"""

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spark_jobs.config import PROJECT_DIR, default_jars_dir
from tests.conftest import cli_env

pytestmark = pytest.mark.integration

# What the build reads: pyproject.toml maps the other folders into the wheel.
SOURCES = ("pyproject.toml", "README.md", "spark_jobs", "plugins", "dags", "expectations")

WHERE_THINGS_ARE = """
import importlib.util, json, os
from spark_jobs import airflow_env, config
settings = config.load()
env = airflow_env.environment(settings)
print(json.dumps({
    "in_checkout": config.in_checkout(),
    "code": [importlib.util.find_spec(name).origin
             for name in ("spark_jobs", "spark_jobs.cli", "lakehouse_airflow.jobs")],
    "expectations": str(settings.expectations_dir),
    "suites": sorted(p.name for p in settings.expectations_dir.glob("*.json")),
    "dags_folder": env["AIRFLOW__CORE__DAGS_FOLDER"],
    "plugins_folder": env["AIRFLOW__CORE__PLUGINS_FOLDER"],
}))
"""

# The DAGs parsed from the installed folder, with the plugin loaded from the installed one
# (serializing the reprocess DAG needs the plugin's timetable), as the DAG processor would.
DAGBAG = """
import json, os
from spark_jobs import airflow_env, config
os.environ.update(airflow_env.environment(config.load()))
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag()
print(json.dumps({
    "errors": {path: str(error) for path, error in bag.import_errors.items()},
    "serialized": sorted(dag_id for dag_id, dag in bag.dags.items()
                         if DagSerialization.to_dict(dag)),
    "applications": sorted({(task.resolve(), task.application)[1] for dag in bag.dags.values()
                            for task in dag.tasks if hasattr(task, "resolve")}),
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel built from this checkout."""
    work = tmp_path_factory.mktemp("package")
    sources = work / "sources"
    for name in SOURCES:
        source = PROJECT_DIR / name
        if source.is_dir():
            shutil.copytree(source, sources / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            sources.mkdir(exist_ok=True)
            shutil.copy2(source, sources / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir",
                    str(work / "dist"), str(sources)], check=True, capture_output=True)
    wheel, = (work / "dist").glob("streaming_lakehouse-*.whl")

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    # A path line only: the .pth files of this environment (among them the editable
    # install's link to the checkout) are not processed from there.
    (site_packages / "lakehouse-dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n", "utf-8")
    return venv


def run(installed: Path, *command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """A command of the installed environment, in a folder outside the checkout; the jars
    are a configured folder (the checkout's cache), as on a machine without a checkout."""
    env = cli_env(LAKEHOUSE_JARS_DIR=str(default_jars_dir()))
    env["PATH"] = f"{installed / 'bin'}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    program = str(installed / "bin" / command[0])
    return subprocess.run([program, *command[1:]], cwd=installed.parent, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_code_suites_dags_and_plugin(installed: Path) -> None:
    places = json.loads(run(installed, "python", "-c", WHERE_THINGS_ARE).stdout)
    # Everything resolves inside the fresh environment, nothing in the checkout.
    assert places["in_checkout"] is False
    for path in [*places["code"], places["expectations"], places["dags_folder"],
                 places["plugins_folder"]]:
        assert Path(path).is_relative_to(installed), path
    assert places["suites"] == sorted(p.name for p in (PROJECT_DIR / "expectations")
                                      .glob("*.json"))

    parsed = run(installed, "python", "-c", DAGBAG)
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    bag = json.loads(parsed.stdout.splitlines()[-1])
    assert bag["errors"] == {}
    assert bag["serialized"] == ["lakehouse_maintenance", "lakehouse_quality",
                                 "lakehouse_reprocess", "lakehouse_streaming"]
    # spark-submit gets the installed CLI, resolved where the task runs.
    assert bag["applications"] == [places["code"][1]]


def test_the_installed_lakehouse_streams_validates_and_accounts(installed: Path) -> None:
    root = installed.parent / "lake"
    for command in (("generate", "--events", "300"), ("stream", "--available-now"),
                    ("validate",), ("audit", "--expected")):
        done = run(installed, "lakehouse", *command, "--root", str(root))
        assert done.returncode == 0, f"lakehouse {' '.join(command)}:\n{done.stderr[-3000:]}"
        if command[0] == "validate":
            # One line per suite, every one passed (the installed suites were found).
            verdicts = [line.split()[:2] for line in done.stdout.splitlines()
                        if line.split()[:1] and "." in line.split()[0]]
            assert verdicts and all(verdict == "passed" for _, verdict in verdicts), done.stdout
            assert len(verdicts) == len(list((PROJECT_DIR / "expectations").glob("*.json")))
    assert list((root / "reports").glob("quality-*.html"))
    # The UI plugin's page renders from the installed package's template.
    page = run(installed, "python", "-c", "import sys; from spark_jobs import config; "
               "from lakehouse_airflow.views import stream_health_page; "
               "print(stream_health_page(config.load({'root': sys.argv[1]})))", str(root))
    assert page.returncode == 0, page.stderr[-3000:]
    assert "silver_ad_events" in page.stdout
