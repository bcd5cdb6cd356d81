"""The stack's schema registry, for `stack up --registry`: Apicurio Registry speaking Confluent's API.

Topics written in Confluent's wire format (`-- format: avro-confluent` and the like) carry a
schema id before each value; the registry maps ids to schemas. Apicurio (Apache-2.0) serves
Confluent's REST API at `/apis/ccompat/v7`, so the confluent-kafka client statetable reads
through, and every producer a team already runs, talk to it unchanged.

How it runs here, and why:
- Maven Central serves the application already built (`apicurio-registry-app:<v>:all:tar.gz`:
  quarkus-run.jar and its lib/). Building it from its modules fails: the 2.x and 3.x poms name
  build-time modules Central does not serve (schema-util-provider 3.3.3, the config-index
  deployment module of 2.4.2, 3.3.2's parent pom); the note of issue #68 has the spike.
- It needs Java 21+ (its classes are version 65). The machine's default is 17, so the newest
  JDK under /usr/lib/jvm (or STATETABLE_REGISTRY_JAVA_HOME) runs it; none is a one-line error.
- Its schemas live in the stack's PostgreSQL (database `registry`): a schema id a topic's
  records carry must mean the same schema after `stack down` and `up` as before.
- Bound to the stack's host (127.0.0.1), its management port (health, metrics) too: the API's
  port + 1.
"""
from __future__ import annotations

import os
import re
import tarfile
import urllib.request
from pathlib import Path

from catalog.errors import NotInstalled
from catalog.settings import JARS_DIR, PROJECT_ROOT, StackSettings
from deploy import postgres_server
from deploy.processes import ManagedProcess, require_free_ports, stop_server, wait_ready

DATABASE = "registry"
JAVA_ENV = "STATETABLE_REGISTRY_JAVA_HOME"
MIN_JAVA = 21
APP_DIR = PROJECT_ROOT / ".cache" / "registry"


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("registry", settings.registry_dir)


def url(settings: StackSettings) -> str:
    """What a client's `schema.registry.url` is for this stack (Confluent's API root)."""
    return settings.registry_url


def _java_major(home: Path) -> int:
    try:
        release = (home / "release").read_text()
    except OSError:
        return 0
    found = re.search(r'JAVA_VERSION="(\d+)', release)
    return int(found.group(1)) if found else 0


def java() -> str:
    """A `java` of version 21 or newer: STATETABLE_REGISTRY_JAVA_HOME, JAVA_HOME, then the newest
    JDK under /usr/lib/jvm."""
    candidates = [os.environ.get(JAVA_ENV), os.environ.get("JAVA_HOME")]
    candidates += sorted((str(p) for p in Path("/usr/lib/jvm").glob("*")), key=lambda p: _java_major(Path(p)),
                         reverse=True) if Path("/usr/lib/jvm").is_dir() else []
    for home in filter(None, candidates):
        if _java_major(Path(home)) >= MIN_JAVA and (Path(home) / "bin" / "java").exists():
            return str(Path(home) / "bin" / "java")
    raise NotInstalled(f"registry: Apicurio Registry needs Java {MIN_JAVA} or newer and none was found (JAVA_HOME, "
                       f"/usr/lib/jvm); install one (e.g. `apt-get install -y openjdk-21-jre-headless`) or set "
                       f"{JAVA_ENV} to its folder")


def app() -> Path:
    """The unpacked application (quarkus-run.jar), unpacked once from the archive
    `python -m deploy.jars fetch registry` copied."""
    archives = sorted((JARS_DIR / "registry").glob("apicurio-registry-app-*-all.tar.gz"))
    if not archives:
        raise NotInstalled("registry: the Apicurio Registry archive is missing from .cache/jars/registry; run "
                           "`.venv/bin/python -m deploy.jars fetch registry` (or `make setup`)")
    archive = archives[-1]
    target = APP_DIR / archive.name.removesuffix("-all.tar.gz")
    if not (target / ".unpacked").exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        (target / ".unpacked").touch()
    return target / "quarkus-run.jar"


def start(settings: StackSettings) -> None:
    if process(settings).is_running():
        return
    runner, java_bin = app(), java()
    require_free_ports("registry", settings.host, settings.registry_port, settings.registry_port + 1)
    postgres_server.start(settings, (DATABASE,))
    env = {**os.environ,
           "QUARKUS_HTTP_HOST": settings.host, "QUARKUS_HTTP_PORT": str(settings.registry_port),
           # Its health and metrics port (on by build, 0.0.0.0:9000 by default): the stack's host, the
           # port after the API's.
           "QUARKUS_MANAGEMENT_HOST": settings.host, "QUARKUS_MANAGEMENT_PORT": str(settings.registry_port + 1),
           "APICURIO_STORAGE_KIND": "sql", "APICURIO_STORAGE_SQL_KIND": "postgresql",
           "APICURIO_DATASOURCE_URL": f"jdbc:postgresql://{settings.host}:{settings.postgres_port}/{DATABASE}",
           "APICURIO_DATASOURCE_USERNAME": postgres_server.USER,
           # The JVM takes the password from its environment (mode-600 files hold it on disk):
           # never on its command line, where `ps` would show it.
           "APICURIO_DATASOURCE_PASSWORD": postgres_server.password(settings)}
    settings.registry_dir.mkdir(parents=True, exist_ok=True)
    process(settings).start([java_bin, "-Xmx384m", "-XX:+UseSerialGC", "-jar", str(runner)], env=env,
                            cwd=settings.registry_dir)


def is_healthy(settings: StackSettings) -> bool:
    try:
        with urllib.request.urlopen(f"{url(settings)}/schemas/types", timeout=2.0) as answer:
            return answer.status == 200 and process(settings).is_running()
    except OSError:
        return False


def wait_healthy(settings: StackSettings, timeout: float = 120.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout,
               what=f"the schema registry at {url(settings)}", interval=0.5)


def stop(settings: StackSettings) -> bool:
    return stop_server(process(settings), settings.host, settings.registry_port, "the schema registry")


def status_line(settings: StackSettings) -> str:
    return f"registry {url(settings)} {'up' if is_healthy(settings) else 'down'}"
