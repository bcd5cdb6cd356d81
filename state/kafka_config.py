"""One Kafka client configuration for every client statetable makes.

Kafka Streams passes one client config to each of its producers, consumers and admin clients;
so does statetable: the changelog producers and restore consumers, the admin and metadata
clients, the query replicas' followers, Spark's Kafka source and sink (as `kafka.*` Java
properties) and the CLI's samples all start from `client_config`.

Where it comes from: `STATETABLE_KAFKA_CONFIG=path`, a properties file in librdkafka's names
(`security.protocol`, `sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`,
...). It holds secrets, so it must not be readable by group or others (mode 600), and no
value of it is ever logged: `describe` masks them. `bootstrap.servers` in the file wins over
the deployment's broker address only when the deployment names none.

Topics statetable creates (changelogs, dead letters, change topics) take
`STATETABLE_TOPIC_REPLICATION_FACTOR` (default -1: the broker's `default.replication.factor`,
as Kafka Streams' `replication.factor` does) and `STATETABLE_TOPIC_MIN_INSYNC_REPLICAS`
(default: the broker's).

Inside Airflow, the Kafka provider's `kafka_default` connection names the brokers. The file
wins for security settings, because it reaches every process, the Spark Connect server's
executors included, and a connection does not; a connection whose extra holds a security
setting the file lacks or contradicts fails the task at once (`connection_mismatch`), rather
than leaving one client secured and another not.
"""
from __future__ import annotations

import os
import stat
from functools import lru_cache
from pathlib import Path
from state.errors import BadSetting

__all__ = ["CONFIG_ENV", "MIN_ISR_ENV", "REGISTRY_PREFIX", "REGISTRY_URL_ENV", "REPLICATION_ENV", "SECRET_WORDS",
           "client_config", "registry_config",
           "connection_mismatch", "describe", "file_config", "min_insync_replicas", "replication_factor",
           "spark_options"]

CONFIG_ENV = "STATETABLE_KAFKA_CONFIG"
REPLICATION_ENV = "STATETABLE_TOPIC_REPLICATION_FACTOR"
MIN_ISR_ENV = "STATETABLE_TOPIC_MIN_INSYNC_REPLICAS"
SECRET_WORDS = ("password", "secret", "jaas", "key.pem", "token", "ssl.key.location", "user.info")
# The schema registry's settings ride in the same file under Confluent's client names
# (`schema.registry.url`, `schema.registry.basic.auth.user.info`, `schema.registry.ssl.ca.location`):
# one file, one mode-600 place for every secret. librdkafka refuses names it does not know, so
# they are taken out of every Kafka client's config and given to the registry client alone.
REGISTRY_PREFIX = "schema.registry."
REGISTRY_URL_ENV = "STATETABLE_SCHEMA_REGISTRY_URL"


def client_config(bootstrap: str | None, **overrides) -> dict:
    """librdkafka settings for one client: the shared file's, the broker address, then the
    caller's own (group ids, isolation, batching)."""
    conf = {k: v for k, v in file_config(os.environ.get(CONFIG_ENV, "")) if not k.startswith(REGISTRY_PREFIX)}
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    conf.update(overrides)
    return conf


def spark_options(bootstrap: str) -> dict[str, str]:
    """The same settings as Spark's Kafka source and sink take them (`kafka.` + Java names)."""
    conf = client_config(bootstrap)
    options = {"kafka.bootstrap.servers": conf.pop("bootstrap.servers")}
    protocol = conf.pop("security.protocol", None)
    if protocol:
        options["kafka.security.protocol"] = protocol.upper()
    mechanism = conf.pop("sasl.mechanism", conf.pop("sasl.mechanisms", None))
    user, password = conf.pop("sasl.username", None), conf.pop("sasl.password", None)
    if mechanism:
        options["kafka.sasl.mechanism"] = mechanism.upper()
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism.upper() == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        if user is not None:
            options["kafka.sasl.jaas.config"] = (f'{module} required username="{_jaas(user)}" '
                                                 f'password="{_jaas(password or "")}";')
    ca = conf.pop("ssl.ca.location", None)
    if ca:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = ca
    cert, key = conf.pop("ssl.certificate.location", None), conf.pop("ssl.key.location", None)
    if cert and key:
        options["kafka.ssl.keystore.type"] = "PEM"
        options["kafka.ssl.keystore.certificate.chain"] = Path(cert).read_text()
        options["kafka.ssl.keystore.key"] = Path(key).read_text()
    if conf.pop("ssl.endpoint.identification.algorithm", None) == "none":
        options["kafka.ssl.endpoint.identification.algorithm"] = ""
    return options


def registry_config(default_url: str | None = None) -> dict:
    """The schema-registry client's settings (confluent-kafka's names: `url`, `basic.auth.user.info`,
    `ssl.ca.location`, ...): the client config file's `schema.registry.*`, else
    STATETABLE_SCHEMA_REGISTRY_URL, else `default_url` (the local stack's registry)."""
    conf = {k.removeprefix(REGISTRY_PREFIX): v for k, v in file_config(os.environ.get(CONFIG_ENV, ""))
            if k.startswith(REGISTRY_PREFIX)}
    conf.setdefault("url", os.environ.get(REGISTRY_URL_ENV, "").strip() or default_url)
    if not conf["url"]:
        del conf["url"]
    return conf


def describe(conf: dict) -> dict:
    """The config as it may be logged: every secret masked."""
    return {k: ("***" if any(w in k.lower() for w in SECRET_WORDS) else v) for k, v in conf.items()}


def replication_factor() -> int:
    return _replicas(REPLICATION_ENV, allowed="a positive number, -1 for the broker's default,") or -1


def min_insync_replicas() -> int | None:
    return _replicas(MIN_ISR_ENV, allowed="a positive number")


def _replicas(name: str, allowed: str) -> int | None:
    """A replica count from the environment (None: unset); anything else fails naming the fix."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if raw.lstrip("-").isdigit() and (int(raw) > 0 or raw == "-1" and name == REPLICATION_ENV):
        return int(raw)
    raise BadSetting(f"{name}={raw!r}: give {allowed} or unset it")


@lru_cache(maxsize=8)
def _cached(path: str, mtime: int) -> tuple:
    entries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise BadSetting(f"{CONFIG_ENV}={path}: line {number} is not `name=value`")
        entries.append((line[:sep].strip(), line[sep + 1:].strip()))
    return tuple(entries)


def file_config(path: str) -> tuple:
    """The settings of a client.properties, refused when others may read it."""
    if not path:
        return ()
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise BadSetting(f"{CONFIG_ENV}={path}: no such file; unset it or point it at a client.properties") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BadSetting(f"{CONFIG_ENV}={path}: it holds secrets but group or others may read it "
                         f"(mode {stat.S_IMODE(info.st_mode):o}); `chmod 600 {path}`")
    return _cached(path, info.st_mtime_ns)


def connection_mismatch(conn_id: str, extra: dict) -> str | None:
    """Why an Airflow Kafka connection's `extra` disagrees with the shared client config (one
    line naming the connection, the setting and the fix), or None when it agrees. Only what the
    connection sets is compared, and `bootstrap.servers` is the connection's to give."""
    conf = dict(file_config(os.environ.get(CONFIG_ENV, "")))
    for name, value in sorted(extra.items()):
        if name == "bootstrap.servers" or name.startswith("group.") or str(conf.get(name, "")) == str(value):
            continue
        shown = "<secret>" if any(word in name for word in SECRET_WORDS) else value
        where = f"{CONFIG_ENV}={os.environ[CONFIG_ENV]}" if os.environ.get(CONFIG_ENV) else f"{CONFIG_ENV} (unset)"
        return (f"Airflow connection {conn_id!r} sets {name}={shown}, but statetable's clients, Spark's executors "
                f"included, take their Kafka settings from {where}, which "
                f"{'has no ' + name if name not in conf else 'sets it otherwise'}; put {name} in that file "
                f"(mode 600) and keep only bootstrap.servers (and matching settings) in the connection")
    return None


def _jaas(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
