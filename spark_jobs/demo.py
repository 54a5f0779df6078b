"""``lakehouse demo`` (``make run``): the whole lakehouse on one laptop, under real Airflow.

Starts ``airflow standalone`` (API server and UI, scheduler, DAG processor, triggerer; the
embedded SQLite database; authentication on; every port on loopback, see
``airflow_standalone``) with the four DAGs unpaused, and a continuous
feed of messy ad events into the landing zone. The ``lakehouse_streaming`` DAG submits the
streams; gold rows follow within minutes. ``Ctrl-C`` (or SIGTERM) stops everything
cleanly: the feed, then the streams at a batch boundary (the streaming DAG is paused first
so it does not restart them), then Airflow.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from spark_jobs import airflow_standalone, landing_feed, registry
from spark_jobs.airflow_env import environment
from spark_jobs.config import LOOPBACK, Settings, console_script

DAGS = ("lakehouse_streaming", "lakehouse_quality", "lakehouse_maintenance",
        "lakehouse_reprocess")
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
# A bot among the users clicks this many times the alert limit a minute, whatever the
# feed's rate, so the alert path has something to raise every minute.
BOT_OVER_LIMIT = 1.7
# Valid events are about 94% of the generator's messy feed; the bot's share is of those.
VALID_SHARE = 0.94


def bot_share(settings: Settings, rate: float) -> float:
    """The share of valid events that are the bot's clicks (``--click-fraud``)."""
    valid_per_minute = rate * 60 * VALID_SHARE
    return min(0.5, BOT_OVER_LIMIT * settings.alert_clicks_per_minute / valid_per_minute)
# The streams' micro-batch interval under the demo. Each micro-batch of a layer costs a few
# seconds whatever its size (Delta commits and MERGEs; bench/HISTORY.md, "Where the time
# goes in a small micro-batch"), so with 5 s the five streams ran batches back to back and
# took both cores of a laptop from the reprocess and validation jobs beside them.
DEMO_TRIGGER = "20 seconds"


@dataclass(frozen=True)
class DemoOptions:
    port: int = 8080
    rate: float = 20.0  # events per second of the demo feed
    trigger: str = DEMO_TRIGGER
    startup_timeout: float = 300.0


def airflow_environment(settings: Settings, options: DemoOptions) -> dict[str, str]:
    env = environment(settings)
    # The streaming DAG's driver reads its trigger from the environment Airflow passes on.
    env["LAKEHOUSE_TRIGGER_INTERVAL"] = options.trigger
    env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
    env.setdefault("AIRFLOW__API__PORT", str(options.port))
    # Loopback unless the user exposes it deliberately (README, "Security").
    env.setdefault("AIRFLOW__API__HOST", LOOPBACK)
    env.setdefault("AIRFLOW__API__BASE_URL", f"http://localhost:{options.port}")
    # Its task log servers listen on loopback, where the API server asks for them.
    env.setdefault("AIRFLOW__CORE__HOSTNAME_CALLABLE", airflow_standalone.HOSTNAME_CALLABLE)
    # The demo's executor runs the streaming driver and the periodic jobs side by side.
    env.setdefault("AIRFLOW__CORE__PARALLELISM", "8")
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


def reachable_host(bound: str) -> str:
    """Where this machine reaches a server bound to ``bound`` (an unspecified address
    means every interface, loopback included)."""
    try:
        return LOOPBACK if ipaddress.ip_address(bound).is_unspecified else bound
    except ValueError:  # a host name
        return bound


def wait_until_healthy(host: str, port: int, timeout: float,
                       airflow: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://{reachable_host(host)}:{port}/api/v2/monitor/health"
    while True:
        if airflow.poll() is not None:
            raise RuntimeError(f"airflow standalone exited with status {airflow.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                health = json.load(response)
            if health.get("scheduler", {}).get("status") == "healthy":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Airflow was not healthy at {url} after {timeout:g}s")
        time.sleep(2)


def run(settings: Settings, options: DemoOptions) -> int:
    env = airflow_environment(settings, options)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    log_dir = settings.root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Their own process groups: Ctrl-C reaches this supervisor only, which stops them in order.
    airflow = subprocess.Popen([sys.executable, "-m", airflow_standalone.MODULE], env=env,
                               stdout=(log_dir / "airflow-standalone.log").open("ab"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    feed = landing_feed.start_feed(settings.root, options.rate, "--click-fraud",
                                   f"{bot_share(settings, options.rate):.4f}", env=env,
                                   log=(log_dir / "demo-feed.log").open("ab"))
    status = 0
    try:
        print(f"starting Airflow (log: {log_dir / 'airflow-standalone.log'}) ...", flush=True)
        host = env["AIRFLOW__API__HOST"]
        wait_until_healthy(host, options.port, options.startup_timeout, airflow)
        passwords = Path(env["AIRFLOW_HOME"]) / PASSWORDS_FILE
        exposure = (f"listening on {host} only; AIRFLOW__API__HOST=<address> exposes it"
                    if host == LOOPBACK else f"listening on {host}")
        print(f"\nAirflow UI: http://localhost:{options.port}  (user admin; the generated "
              f"password is in {passwords})\n"
              f"{exposure}\n"
              f"DAGs (unpaused): {', '.join(DAGS)}\n"
              f"demo feed: {options.rate:g} messy events/s into {settings.landing_events}\n"
              f"tables: {settings.tables_dir}  (lakehouse sql --root {settings.root} "
              f"'SELECT * FROM gold.campaign_stats ORDER BY window_start DESC LIMIT 10')\n"
              "Ctrl-C stops everything cleanly.", flush=True)
        first_report = FirstReport(settings, env, log_dir)
        while not stop.wait(2):
            first_report.poll()
            if airflow.poll() is not None:
                print(f"airflow standalone exited with status {airflow.returncode}",
                      file=sys.stderr)
                status = 1
                break
    except RuntimeError as error:
        print(f"lakehouse demo: {error}", file=sys.stderr)
        status = 1
    finally:
        _shut_down(settings, env, feed, airflow)
    return status


class FirstReport:
    """Triggers ``lakehouse_quality`` once, as soon as gold has rows: its schedule (hourly,
    and on asset updates, which continuous streams never finish a task to emit) would
    leave a new user without a data quality report for up to an hour. A failed trigger
    (SQLite busy, the DAG not serialized yet) is tried again."""

    def __init__(self, settings: Settings, env: dict[str, str], log_dir: Path) -> None:
        self.gold = registry.TABLES["gold.campaign_stats"].path(settings)
        self.env, self.log = env, log_dir / "first-quality-run.log"
        self.trigger: subprocess.Popen[bytes] | None = None
        self.done = False
        self.next_look = 0.0

    def poll(self) -> None:
        if self.done or time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + 10
        if self.trigger is not None:
            if self.trigger.poll() is None:
                return
            self.done = self.trigger.returncode == 0
            if self.done:
                print("gold has rows: the first data quality run is triggered (its report "
                      "follows under Browse > Data quality report)", flush=True)
                return
        if not self._gold_has_rows():
            return
        with self.log.open("ab") as log:
            self.trigger = subprocess.Popen(
                [console_script("airflow"), "dags", "trigger", "lakehouse_quality"], env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _gold_has_rows(self) -> bool:
        from spark_jobs import delta_reader

        try:
            return delta_reader.read_arrow(self.gold, ["views"]).num_rows > 0
        except Exception:  # noqa: BLE001 - not created, mid-creation or being compacted
            return False


def _shut_down(settings: Settings, env: dict[str, str], feed: subprocess.Popen[bytes],
               airflow: subprocess.Popen[bytes]) -> None:
    print("stopping: the feed, the streams (at a batch boundary), then Airflow ...",
          flush=True)
    _terminate(feed, 30)
    if airflow.poll() is None:
        # Paused first, so the @continuous DAG does not start the streams again.
        subprocess.run([console_script("airflow"), "dags", "pause", "lakehouse_streaming"],
                       env=env, capture_output=True, timeout=120)
    subprocess.run([console_script("lakehouse"), "stop", "--root", str(settings.root),
                    "--wait", "180"], env=env, timeout=240)
    _terminate(airflow, 60)
    print("stopped", flush=True)


# How long the rest of a process group may outlive its leader once it has stopped.
GROUP_STRAGGLERS_SECONDS = 15.0


def _terminate(process: subprocess.Popen[bytes], grace: float) -> None:
    """Stop ``process`` and its process group: SIGTERM, SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        except ProcessLookupError:
            pass
    # The leader gone, its group may live on: Airflow's DAG processor was seen hung in its
    # own shutdown for minutes after the SIGTERM, orphaned, after the standalone exited.
    deadline = time.monotonic() + GROUP_STRAGGLERS_SECONDS
    try:
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)  # raises once no process of the group is left
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
