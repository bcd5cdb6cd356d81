"""Kafka's refusals as one line a user can act on: the broker, the principal, what was refused
and the fix.

librdkafka reports a refused login or a failed TLS handshake only to a client's error callback,
and the call that needed the connection then fails with a bare "Broker transport failure";
an ACL refusal arrives as an error code on the topic's metadata or on a delivery. Each client
statetable makes records its connection errors here (`recorder`), so the exception a caller
raises can say which of them it was.
"""
from __future__ import annotations

import os
import re

from state.kafka_config import CONFIG_ENV, client_config
from state.errors import BrokerUnreachable, KafkaAccessError

__all__ = ["AUTHORIZATION_ERRORS", "BROKER_LOST", "CONNECTION_ERRORS", "KafkaAccessError", "LEADER_MOVING",
           "REFUSED", "UNREACHABLE", "broker_lost", "connection_error", "denied", "is_connection_failure",
           "recorder", "refused"]

UNREACHABLE = {"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"}    # no broker answered
REFUSED = {"_AUTHENTICATION", "_SSL"}                              # a broker answered, and refused the client
CONNECTION_ERRORS = REFUSED | (UNREACHABLE - {"_TIMED_OUT"})       # worth remembering: a timeout says nothing of why
AUTHORIZATION_ERRORS = {"TOPIC_AUTHORIZATION_FAILED": "topic", "GROUP_AUTHORIZATION_FAILED": "group",
                        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional-id",
                        "CLUSTER_AUTHORIZATION_FAILED": "cluster"}
# A partition whose leader just died or moved: asked again, the new leader answers.
LEADER_MOVING = {"NOT_LEADER_OR_FOLLOWER", "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "_DESTROY_BROKER",
                 "REQUEST_TIMED_OUT"} | UNREACHABLE
# What a broker lost while a batch commits can raise anywhere in it; the batch, run again from its
# recorded plan, succeeds once the cluster has moved leadership and coordinators.
BROKER_LOST = LEADER_MOVING | {"_WAIT_COORD", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
                               "COORDINATOR_LOAD_IN_PROGRESS", "NOT_ENOUGH_REPLICAS",
                               "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE"}
_seen: dict[str, tuple[str, str]] = {}


def recorder(bootstrap: str):
    """An error_cb keeping the newest connection error seen for `bootstrap`."""
    def record(error) -> None:
        if error.name() in CONNECTION_ERRORS and (error.name() != "_TRANSPORT" or bootstrap not in _seen):
            _seen[bootstrap] = (error.name(), error.str())
    return record


def broker_lost(exc: BaseException) -> str | None:
    """The name of the Kafka error behind `exc` (raised here, or in a Spark task and reported as
    text) when it is one a lost broker causes; None otherwise. A BrokerUnreachable counts: a
    merge task's producer or metadata call that outwaited its patience while the broker it asked
    was down says so as one (the secure stack's broker kills met it under CI's load)."""
    if isinstance(exc, BrokerUnreachable):
        return BrokerUnreachable.__name__
    if exc.args and hasattr(exc.args[0], "name"):          # a KafkaException raised in this process
        name = exc.args[0].name()
    else:                                                   # a task's error, as Spark reports it: text
        found = re.search(r"KafkaError\{code=(\w+)|\b(BrokerUnreachable): ", str(exc))
        name = (found.group(1) or found.group(2)) if found else None
    return name if name in BROKER_LOST or name == BrokerUnreachable.__name__ else None


def refused(bootstrap: str) -> bool:
    """The brokers at `bootstrap` refused a login or a TLS handshake: retrying will not help."""
    return _seen.get(bootstrap, ("", ""))[0] in ("_AUTHENTICATION", "_SSL")


def _principal(conf: dict) -> str:
    if conf.get("sasl.username"):
        return f"user {conf['sasl.username']!r} ({conf.get('sasl.mechanism', conf.get('sasl.mechanisms', 'GSSAPI'))})"
    if conf.get("ssl.certificate.location"):
        return f"the certificate {conf['ssl.certificate.location']}"
    return f"an anonymous client ({conf.get('security.protocol', 'PLAINTEXT')}, no credentials)"


def _source() -> str:
    path = os.environ.get(CONFIG_ENV)
    return f"{CONFIG_ENV}={path}" if path else f"the client config ({CONFIG_ENV} is unset)"


def connection_error(bootstrap: str, client=None, what: str = "") -> KafkaAccessError:
    """Why no broker at `bootstrap` answered, from the client's error callback."""
    if client is not None:
        try:
            client.poll(0.3)            # serves the error callbacks still queued
        except Exception:               # noqa: BLE001 - the explanation must not fail itself
            pass
    conf = client_config(bootstrap)
    name, text = _seen.get(bootstrap, ("", ""))
    found = re.match(r"\w+://([^/ ]+)", text)
    broker = found.group(1) if found else bootstrap
    doing = f" ({what})" if what else ""
    if name == "_AUTHENTICATION":
        return KafkaAccessError(f"kafka {broker} refused {_principal(conf)}{doing}: wrong username or password, or "
                                f"no such user; fix sasl.username and sasl.password in {_source()}")
    if name == "_SSL":
        detail = text.split(": ", 2)[-1].split(" (after")[0].split(": ")[-1]
        return KafkaAccessError(f"kafka {broker}: TLS handshake failed for {_principal(conf)}{doing} ({detail}); "
                                f"set ssl.ca.location in {_source()} to the CA that signed the brokers' certificates")
    return BrokerUnreachable(f"kafka {bootstrap}: no broker answered {_principal(conf)}{doing}; a broker may be down, "
                            f"or it expects another security.protocol than "
                            f"{conf.get('security.protocol', 'PLAINTEXT')} (a secured cluster needs its SASL_SSL "
                            f"settings in {_source()})")


def denied(bootstrap: str, code: str, operation: str, name: str) -> KafkaAccessError:
    """An ACL refusal: which principal lacks what on which resource, and the command that grants it."""
    conf = client_config(bootstrap)
    resource = AUTHORIZATION_ERRORS.get(code, "topic")
    user = conf.get("sasl.username") or "ANONYMOUS"
    target = "--cluster" if resource == "cluster" else f"--{resource} {name}"
    return KafkaAccessError(
        f"kafka {bootstrap}: {_principal(conf)} lacks {operation.upper()} on {resource} {name!r} ({code}); grant it: "
        f"kafka-acls.sh --bootstrap-server {bootstrap.split(',')[0]} --add --allow-principal User:{user} "
        f"--operation {operation.capitalize()} {target}")


def is_connection_failure(error) -> bool:
    return error.name() in UNREACHABLE | REFUSED
