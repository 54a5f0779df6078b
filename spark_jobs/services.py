"""Real services beside the lakehouse, started by its own command, no Docker:
``lakehouse services start|stop|status NAME...``.

- ``kafka``: a single-node KRaft broker (controller and broker in one JVM) from the jars
  ``make setup`` caches (``jars/kafka-broker/pom.xml``), at ``kafka_bootstrap_servers``, with
  ``kafka_topic`` created;
- ``spark``: Spark's own standalone master and one worker with this machine's cores, from
  the installed PySpark, at ``spark://127.0.0.1:7077``;
- ``postgres``: Debian's PostgreSQL, a database cluster of its own for Airflow at
  ``postgres_port``, password authentication only;
- ``s3``: an S3-compatible server (moto's, from PyPI) at ``s3_endpoint`` (a loopback
  ``http://`` URL), for object-store roots on one machine and their tests; it honours
  conditional writes as S3 does, and keeps its objects in memory until it stops.

Each listens on loopback only, keeps its data and logs under ``<root>/services/<name>/``;
``start`` leaves a running service alone and returns once it answers (or fails with the
end of its log); ``stop`` asks each process to stop (SIGTERM; PostgreSQL SIGINT, its fast
shutdown) and waits, then kills;
``status`` prints one line per service. Test fixtures use these same functions.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.config import LOOPBACK, LOOPBACK_NAMES, ConfigError, Settings

START_TIMEOUT_SECONDS = 90.0
STOP_GRACE_SECONDS = 30.0
SPARK_MASTER_PORT = 7077
# The standalone master's and worker's status pages, on loopback (SPARK_LOCAL_IP): Spark has
# no login of its own, so they are not served beyond this machine.
SPARK_MASTER_UI_PORT = 8081
SPARK_WORKER_UI_PORT = 8082
# Spark's own filter for its pages: a signed token (JWS) in the Authorization header.
SPARK_UI_FILTER = "org.apache.spark.ui.JWSFilter"
LOGIN_SECRET_VARIABLE = "AIRFLOW__API_AUTH__JWT_SECRET"
# Airflow signs the login's tokens with HS512, and Spark's check (jjwt) refuses to verify
# HS512 with a key under 512 bits: a shorter key would answer 403 to every token.
LOGIN_SECRET_MIN_BYTES = 64


# The largest message the broker and the producer take: the contract's records run up to
# 1 MiB (a very long line), over Kafka's default of 1,000,000 bytes.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class ServiceError(RuntimeError):
    """A service did not start, stop or answer; the message says which and why."""


@dataclass(frozen=True)
class Daemon:
    """One long-running process of a service, known by its pid file in ``folder``."""

    name: str
    folder: Path
    command: tuple[str, ...]
    port: int  # it answers once this loopback port accepts connections
    env: dict[str, str] = field(default_factory=dict)  # added to this process's own
    stop_signal: int = signal.SIGTERM
    other_ports: tuple[int, ...] = ()  # it also binds these: they must be free too

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, *self.other_ports)

    @property
    def pid_file(self) -> Path:
        return self.folder / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / f"{self.name}.log"

    def pid(self) -> int | None:
        """The running process, or None. The pid file holds the process's number and its
        start time: a number that now belongs to another program names nothing."""
        try:
            pid_text, started = self.pid_file.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if _start_time(pid) == started and not _zombie(pid) else None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=_daemon_environment(self.env), cwd=self.folder, start_new_session=True)
        self.pid_file.write_text(f"{process.pid} {_start_time(process.pid)}\n")
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not port_open(self.port):
            if process.poll() is not None:
                raise ServiceError(f"{self.name} exited with {process.returncode} while "
                                   f"starting; the end of {self.log_file}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(f"{self.name} did not answer on {LOOPBACK}:{self.port} "
                                   f"within {START_TIMEOUT_SECONDS:.0f} s; the end of "
                                   f"{self.log_file}:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> bool:
        """Stop it if it runs; whether it ran."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, self.stop_signal)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while _alive(pid):
                if time.monotonic() > deadline:
                    raise ServiceError(f"{self.name} (pid {pid}) outlived SIGKILL")
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _start_time(pid: int) -> str | None:
    """When the process started (clock ticks since boot): with its number, its identity."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _signal_group(pid: int, signum: int) -> None:
    """Signal the daemon and its children: it leads its own session and group (started so);
    a process that does not lead one is signalled alone, never a group it merely joined."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise ServiceError(f"no permission to signal pid {pid}") from None


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def free_kafka_port() -> int:
    """A free port on loopback whose next one is free too: a broker's listener and its
    controller's (for a broker of its own: a test's, a benchmark's)."""
    while True:
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        if port < 65000 and not port_open(port + 1):
            return port


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    binary = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not binary or not Path(binary).exists():
        raise ServiceError("no java: install Java 17 or set JAVA_HOME")
    return binary


def _java_or_name() -> str:
    """``java`` as a command line names it; checked where it must run (preparing)."""
    try:
        return java()
    except ServiceError:
        return "java"


@dataclass(frozen=True)
class Service:
    """A named service: its processes in start order, what to prepare before the first
    start, what to do once they answer, and how to describe it running."""

    name: str
    daemons: Callable[[Settings], list[Daemon]]
    prepare: Callable[[Settings, Path], None]
    when_up: Callable[[Settings], None]
    describe: Callable[[Settings], str]

    def folder(self, settings: Settings) -> Path:
        return settings.services_dir / self.name

    @contextlib.contextmanager
    def _exclusive(self, settings: Settings) -> Iterator[None]:
        """One start or stop of this service of this root at a time (two starts would both
        prepare its storage and both launch it)."""
        folder = self.folder(settings)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self, settings: Settings) -> str:
        daemons = self.daemons(settings)  # a configuration it cannot run fails first
        with self._exclusive(settings):
            if all(daemon.pid() is not None for daemon in daemons):
                self.when_up(settings)
                return f"{self.name}: already running, {self.describe(settings)}"
            for daemon in daemons:
                taken = [port for port in daemon.ports if port_open(port)]
                if daemon.pid() is None and taken:
                    raise ServiceError(
                        f"{self.name}: port {LOOPBACK}:{taken[0]} is taken by another "
                        f"program (not the {daemon.name} of {self.folder(settings)})")
            self.prepare(settings, self.folder(settings))
            for daemon in daemons:
                if daemon.pid() is None:
                    daemon.start()
            self.when_up(settings)
            return f"{self.name}: started, {self.describe(settings)}"

    def stop(self, settings: Settings) -> str:
        with self._exclusive(settings):
            stopped = [daemon.stop() for daemon in reversed(self.daemons(settings))]
        return f"{self.name}: {'stopped' if any(stopped) else 'not running'}"

    def status(self, settings: Settings) -> str:
        daemons = self.daemons(settings)
        pids = [daemon.pid() for daemon in daemons]
        if not any(pids):
            return f"{self.name}: stopped"
        pairs = list(zip(daemons, pids, strict=True))
        running = ", ".join(f"{daemon.name} pid {pid}" for daemon, pid in pairs if pid)
        if not all(pids):
            missing = ", ".join(daemon.name for daemon, pid in pairs if not pid)
            return f"{self.name}: partly running ({running}; {missing} not running)"
        return f"{self.name}: running ({running}), {self.describe(settings)}"


# -- kafka ---------------------------------------------------------------------------------

def _kafka_port(settings: Settings) -> int:
    from spark_jobs.kafka_topic import bootstrap_address

    address = bootstrap_address(settings)
    if address.host not in LOOPBACK_NAMES:
        raise ConfigError(f"kafka_bootstrap_servers = {settings.kafka_bootstrap_servers!r} "
                          f"names another machine: lakehouse services runs a broker on this "
                          f"machine's loopback only")
    return address.port


def _kafka_daemons(settings: Settings) -> list[Daemon]:
    folder = settings.services_dir / "kafka"
    jars = settings.kafka_broker_jars
    return [Daemon("broker", folder, (
        _java_or_name(), "-Xms256m", "-Xmx512m", "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}",
        "-cp", f"{jars}/*", "kafka.Kafka", str(folder / "server.properties")),
        _kafka_port(settings))]


# Logs to the broker's own log file (its stdout); INFO at start-up tells why it failed.
_KAFKA_LOGGING = """\
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
"""


def _prepare_kafka(settings: Settings, folder: Path) -> None:
    """The broker's configuration, and its storage formatted once (KRaft needs a cluster id
    written before the first start)."""
    jars = settings.kafka_broker_jars
    if not (jars / ".complete").exists():
        raise ServiceError(f"no Kafka broker in {jars}: run 'make setup' once in the checkout "
                           f"(it fetches the broker from Maven Central)")
    port = _kafka_port(settings)
    data = folder / "data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log4j2.properties").write_text(_KAFKA_LOGGING)
    (folder / "server.properties").write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{LOOPBACK}:{port + 1}",
        f"listeners=PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{port + 1}",
        f"advertised.listeners=PLAINTEXT://{LOOPBACK}:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data}",
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        # Topics are created on purpose (the topic's partitions are a setting); a reader
        # with a misspelt topic must not create an empty one and wait on it for ever.
        "auto.create.topics.enable=false",
        # The contract's records run up to 1 MiB; Kafka's default cap is 1 MB.
        f"message.max.bytes={MAX_MESSAGE_BYTES}",
        f"num.partitions={settings.kafka_partitions}",
        "",
    ]))
    if not (data / "meta.properties").exists():
        cluster_id = "-"
        while cluster_id.startswith("-"):  # read as an option by the storage tool
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            [java(), "-Xmx256m", f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}",
             "-cp", f"{jars}/*", "kafka.tools.StorageTool", "format", "-t", cluster_id,
             "-c", str(folder / "server.properties")],
            capture_output=True, text=True, check=False)
        if formatted.returncode != 0:
            raise ServiceError(f"kafka: formatting {data} failed: "
                               f"{(formatted.stderr or formatted.stdout).strip()[-600:]}")


def _kafka_topic_ready(settings: Settings) -> None:
    from spark_jobs import kafka_topic

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not kafka_topic.answers(settings, timeout=2.0):  # the port opens before it serves
        if time.monotonic() > deadline:
            raise ServiceError(f"kafka: the broker at {settings.kafka_bootstrap_servers} "
                               f"does not answer metadata requests")
    kafka_topic.ensure_topic(settings)


def _describe_kafka(settings: Settings) -> str:
    from spark_jobs import kafka_topic

    return (f"{LOOPBACK}:{_kafka_port(settings)}, topic {settings.kafka_topic} "
            f"({kafka_topic.partitions(settings)} partitions)")


# -- spark ---------------------------------------------------------------------------------

def spark_home() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ServiceError("PySpark is not installed")
    return Path(spec.origin).parent


def _spark_daemons(settings: Settings) -> list[Daemon]:
    folder = settings.services_dir / "spark"
    home = spark_home()
    env = {"SPARK_HOME": str(home), "SPARK_LOCAL_IP": LOOPBACK,
           "SPARK_LOG_DIR": str(folder),
           "SPARK_DAEMON_MEMORY": "512m"}
    spark_class = str(home / "bin" / "spark-class")
    master = f"spark://{LOOPBACK}:{SPARK_MASTER_PORT}"
    return [
        Daemon("master", folder, (
            spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
            "--port", str(SPARK_MASTER_PORT), "--webui-port", str(SPARK_MASTER_UI_PORT),
            "--properties-file", str(folder / "spark-daemons.conf")),
            SPARK_MASTER_PORT, env, other_ports=(SPARK_MASTER_UI_PORT,)),
        Daemon("worker", folder, (
            spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
            "--cores", str(os.cpu_count() or 1), "--work-dir", str(folder / "work"),
            "--webui-port", str(SPARK_WORKER_UI_PORT),
            "--properties-file", str(folder / "spark-daemons.conf"), master),
            SPARK_WORKER_UI_PORT, env),
    ]


def _prepare_spark(settings: Settings, folder: Path) -> None:
    (folder / "work").mkdir(parents=True, exist_ok=True)
    _write_private(folder / "spark-daemons.conf", spark_daemon_properties(settings))


def spark_daemon_properties(settings: Settings) -> str:
    """The master's and workers' settings (a ``--properties-file``), here and in the Docker
    stack's containers."""
    # Spark's filter wants the key base64url-encoded; Airflow signs with the text's bytes.
    ui_key = base64.urlsafe_b64encode(login_secret(settings).encode()).decode()
    return "\n".join([
        # The master's REST submission server takes any application from anyone who can
        # reach it, without a login: off (spark-submit uses the master's RPC port).
        "spark.master.rest.enabled false",
        # The master's and worker's pages (and their /json/) answer only a request bearing a
        # token signed with the Airflow login's key: the token Airflow's login gives, in an
        # Authorization header. Without one, or with an expired or forged one: 403.
        f"spark.ui.filters {SPARK_UI_FILTER}",
        f"spark.{SPARK_UI_FILTER}.param.secretKey {ui_key}",
        f"spark.{SPARK_UI_FILTER}.param.requireExpiration true",
        # A taken port fails the start instead of moving the page to the next port, where
        # the worker's or the readiness check's idea of it would be wrong.
        "spark.port.maxRetries 0",
        # The applications' folders on the worker (their logs and shipped files) are
        # cleaned up after a day, so a long-running worker does not fill the disk.
        "spark.worker.cleanup.enabled true",
        "spark.worker.cleanup.appDataTtl 86400",
    ])


def _spark_worker_registered(settings: Settings) -> None:
    """The worker answers once it is up, but a job waits until it has registered."""
    import json

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            with urllib.request.urlopen(spark_page(settings, "/json/"), timeout=2) as reply:
                state = json.load(reply)
            if any(worker.get("state") == "ALIVE" for worker in state.get("workers", [])):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServiceError("spark: no worker registered with the master within "
                               f"{START_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.5)


def spark_page(settings: Settings, path: str, port: int = SPARK_MASTER_UI_PORT,
               valid_for_seconds: int = 60) -> urllib.request.Request:
    """A request for a page of the Spark daemons, bearing a short-lived token signed with
    the Airflow login's key, as the token Airflow's own login gives is."""
    import jwt

    now = int(time.time())
    token = jwt.encode({"sub": "lakehouse services", "iat": now, "nbf": now,
                        "exp": now + valid_for_seconds}, login_secret(settings),
                       algorithm="HS512")
    return urllib.request.Request(f"http://{LOOPBACK}:{port}{path}",
                                  headers={"Authorization": f"Bearer {token}"})


def _describe_spark(_settings: Settings) -> str:
    return (f"master spark://{LOOPBACK}:{SPARK_MASTER_PORT} with one worker of "
            f"{os.cpu_count()} cores")


# -- postgres ------------------------------------------------------------------------------

POSTGRES_USER = "lakehouse"  # the database's own user, not a system account
POSTGRES_DATABASE = "airflow"
# The server refuses to run as root; as root, it runs as the system user Debian's package
# made for it, dropping privileges with util-linux's setpriv (an exec: the pid is the
# server's own).
POSTGRES_SYSTEM_USER = "postgres"


def _postgres_bin(program: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"),
                   key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0)
    if not found:
        raise ServiceError("no PostgreSQL server: run 'make setup' (it installs Debian's "
                           "postgresql) or apt-get install postgresql")
    return str(found[-1])


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["setpriv", "--reuid", POSTGRES_SYSTEM_USER, "--regid", POSTGRES_SYSTEM_USER,
            "--init-groups", "--", *command]


def _postgres_daemons(settings: Settings) -> list[Daemon]:
    folder = settings.services_dir / "postgres"
    return [Daemon("postgres", folder, tuple(_as_server_user([
        _postgres_bin("postgres"), "-D", str(folder / "data"),
        "-c", f"listen_addresses={LOOPBACK}", "-p", str(settings.postgres_port),
        # Its socket in its own folder, not /var/run/postgresql (the system's server's).
        "-c", f"unix_socket_directories={folder}"])),
        settings.postgres_port,
        # SIGTERM would wait for every client to disconnect; SIGINT ends their sessions.
        stop_signal=signal.SIGINT)]


def _daemon_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """A daemon's environment: this process's, less the login's key (what a Spark worker
    holds, its executors inherit: the applications it runs must not be able to sign a login),
    plus ``extra``."""
    inherited = {key: value for key, value in os.environ.items()
                 if key != LOGIN_SECRET_VARIABLE}
    return {**inherited, **extra}


def login_secret(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The key Airflow signs its logins' tokens with (``[api_auth] jwt_secret``), which the
    Spark daemons' pages check too: one login for every page the project serves. The
    environment's ``AIRFLOW__API_AUTH__JWT_SECRET`` when set; otherwise made at the first
    use under the root, readable by its owner only (not in the configuration, the
    repository or a log)."""
    import secrets

    env = os.environ if env is None else env
    if given := env.get(LOGIN_SECRET_VARIABLE):
        if len(given.encode()) < LOGIN_SECRET_MIN_BYTES:
            raise ServiceError(
                f"{LOGIN_SECRET_VARIABLE} is {len(given.encode())} bytes: the login's tokens "
                f"are signed with HMAC, which wants a key of at least "
                f"{LOGIN_SECRET_MIN_BYTES} bytes (HS512; python -c 'import secrets; "
                f"print(secrets.token_urlsafe(64))' makes one)")
        return given
    path = login_secret_file(settings)
    if not path.exists():
        import tempfile

        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole aside (0600 from the start), then linked into place: two first uses
        # at once keep the first one's key, and no reader sees half a key.
        descriptor, draft = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_urlsafe(64) + "\n")
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
        finally:
            os.unlink(draft)
    secret = path.read_text().strip()
    if len(secret.encode()) < LOGIN_SECRET_MIN_BYTES:
        raise ServiceError(f"{path} holds no usable login key (under "
                           f"{LOGIN_SECRET_MIN_BYTES} bytes): remove it, and a new one is "
                           f"made at the next start (sign in to Airflow again after)")
    return secret


def login_secret_file(settings: Settings) -> Path:
    return settings.root / "airflow" / "login-secret"


def password_file(settings: Settings) -> Path:
    """The database password, made at the first start (readable by its owner only): not in
    the configuration, the repository or a log."""
    return settings.services_dir / "postgres" / "password"


def postgres_url(settings: Settings, *, driver: str = "postgresql+psycopg2",
                 database: str = POSTGRES_DATABASE) -> str:
    """The database's URL, its password read from :func:`password_file`."""
    from urllib.parse import quote

    try:
        password = password_file(settings).read_text().strip()
    except OSError:
        raise ServiceError(f"no PostgreSQL under {settings.services_dir}: start it with "
                           f"'lakehouse services start postgres'") from None
    return (f"{driver}://{POSTGRES_USER}:{quote(password, safe='')}@{LOOPBACK}:"
            f"{settings.postgres_port}/{database}")


def _prepare_postgres(settings: Settings, folder: Path) -> None:
    """A database cluster of its own, made once: password authentication only, over TCP on
    loopback (no trust, no peer login)."""
    import secrets

    data = folder / "data"
    if (data / "PG_VERSION").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    _write_private(password_file(settings), password)
    if os.geteuid() == 0:
        import pwd

        account = pwd.getpwnam(POSTGRES_SYSTEM_USER)
        os.chown(folder, account.pw_uid, account.pw_gid)
        reachable = subprocess.run(_as_server_user(["test", "-w", str(folder)]), check=False)
        if reachable.returncode != 0:
            raise ServiceError(
                f"postgres: the server runs as the {POSTGRES_SYSTEM_USER} user (root may not "
                f"run it) and cannot reach {folder}: give the folders above it search "
                f"permission (chmod o+x) or choose a root it can reach")
    # initdb reads the password from a file the server's user can read, gone right after.
    handed = folder / ".initdb-password"
    _write_private(handed, password,
                   owner=(account.pw_uid, account.pw_gid) if os.geteuid() == 0 else None)
    try:
        made = subprocess.run(_as_server_user([
            _postgres_bin("initdb"), "-D", str(data), "-U", POSTGRES_USER,
            "--auth=scram-sha-256", f"--pwfile={handed}", "--encoding=UTF8",
            "--locale=C.UTF-8"]), capture_output=True, text=True, check=False)
    finally:
        handed.unlink(missing_ok=True)
    if made.returncode != 0:
        raise ServiceError(f"postgres: initdb failed: {(made.stderr or made.stdout)[-600:]}")


def _write_private(path: Path, text: str, owner: tuple[int, int] | None = None) -> None:
    """``text`` in a file only its owner can read, from its first byte on."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        if owner is not None:
            os.fchown(file.fileno(), *owner)
        file.write(text + "\n")


def _postgres_database(settings: Settings) -> None:
    """The ``airflow`` database, once the server takes connections."""
    import psycopg2

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            connection = psycopg2.connect(postgres_url(settings, driver="postgresql",
                                                       database="postgres"))
            break
        except psycopg2.OperationalError as error:  # starting up
            if time.monotonic() > deadline:
                raise ServiceError(f"postgres does not take connections: {error}") from None
            time.sleep(0.3)
    try:
        connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                           (POSTGRES_DATABASE,))
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE DATABASE {POSTGRES_DATABASE}")
    finally:
        connection.close()


def _describe_postgres(settings: Settings) -> str:
    return (f"postgresql://{POSTGRES_USER}@{LOOPBACK}:{settings.postgres_port}/"
            f"{POSTGRES_DATABASE} (password in {password_file(settings)})")


# -- s3 ------------------------------------------------------------------------------------

def s3_server(settings: Settings) -> Path:
    """moto's server, installed by ``make setup`` in an environment of its own beside the
    jar cache (boto's botocore and Airflow pin different python-dateutil majors)."""
    return settings.jars_dir.parent / "s3-server" / "bin" / "moto_server"


def _s3_port(settings: Settings) -> int:
    address = urllib.parse.urlsplit(settings.s3_endpoint)
    if address.scheme != "http" or address.hostname not in LOOPBACK_NAMES:
        raise ConfigError(
            f"s3: the local S3 server answers at s3_endpoint, which must be an http:// URL on "
            f"loopback (for example http://{LOOPBACK}:9000), not "
            f"{settings.s3_endpoint or 'empty (AWS)'}")
    return address.port or 80


def _s3_daemons(settings: Settings) -> list[Daemon]:
    port = _s3_port(settings)
    server = s3_server(settings)
    if not server.exists():
        raise ServiceError(f"s3: moto's server is not installed at {server}: run 'make "
                           f"setup' in the checkout")
    return [Daemon("moto", settings.services_dir / "s3",
                   (str(server), "--host", LOOPBACK, "--port", str(port)), port)]


def _describe_s3(settings: Settings) -> str:
    return (f"S3 API at {settings.s3_endpoint} (moto: buckets and objects live in memory "
            f"until it stops)")


SERVICES: dict[str, Service] = {
    service.name: service for service in (
        Service("kafka", _kafka_daemons, _prepare_kafka, _kafka_topic_ready, _describe_kafka),
        Service("spark", _spark_daemons, _prepare_spark, _spark_worker_registered,
                _describe_spark),
        Service("postgres", _postgres_daemons, _prepare_postgres, _postgres_database,
                _describe_postgres),
        Service("s3", _s3_daemons, lambda _settings, _folder: None, lambda _settings: None,
                _describe_s3),
    )}


def named(names: list[str]) -> list[Service]:
    unknown = [name for name in names if name not in SERVICES]
    if unknown or not names:
        raise ConfigError(f"unknown service {', '.join(unknown) or '(none given)'}: choose "
                          f"from {', '.join(SERVICES)}")
    return [SERVICES[name] for name in names]


def main(arguments: list[str] | None = None) -> int:
    """For the Docker stack's Spark containers, which run the daemons in the foreground:
    ``python -m spark_jobs.services spark-properties FILE`` writes their settings (readable by
    the owner only), ``python -m spark_jobs.services spark-page PORT`` is their health check
    (exit 0 when the page answers a token of the login)."""
    import sys

    from spark_jobs.config import load

    try:
        match sys.argv[1:] if arguments is None else arguments:
            case ["spark-properties", file]:
                _write_private(Path(file), spark_daemon_properties(load()))
                return 0
            case ["spark-page", port] if port.isdigit():
                with urllib.request.urlopen(spark_page(load(), "/json/", int(port)),
                                            timeout=5) as reply:
                    return 0 if reply.status == 200 else 1
    except (ServiceError, OSError) as failed:
        print(f"spark: {failed}", file=sys.stderr)
        return 1
    print("usage: python -m spark_jobs.services spark-properties FILE | spark-page PORT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
