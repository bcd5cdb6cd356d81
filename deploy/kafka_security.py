"""What `stack up --secure` gives the brokers: a private CA, one certificate the brokers share,
SCRAM-SHA-512 users and ACLs, and the client config statetable's processes read.

Why this shape:
- Clients speak SASL_SSL with SCRAM-SHA-512 (what MSK, Confluent Cloud, Aiven and Strimzi
  offer); the brokers talk to each other and to their controllers over mutual TLS, so no
  broker needs a password, and the stack administers users and ACLs as the brokers' own
  principal over that listener.
- Users are made through the Admin API (AlterUserScramCredentials), not with
  `kafka-storage format --add-scram`: that flag takes the password, or the salted password that
  authenticates just as well, on a command line, which every local user can read.
- statetable's user may read, write, create and describe topics, and use only its own consumer
  groups and transactional ids (prefix `statetable`); it cannot delete or reconfigure topics,
  change ACLs or make users. A production cluster narrows topics to a prefix as well
  (STATETABLE_NAMESPACE; see the README).
Secrets live in files of mode 600 under `.stack/kafka/` and never reach a command line or a log.
"""
from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

from catalog.settings import StackSettings
from deploy.processes import write_private
from deploy.errors import CommandFailed

BROKER_PRINCIPAL = "statetable-broker"      # the certificate's CN; a super user over mutual TLS
CLIENT_USER = "statetable"
MECHANISM = "SCRAM-SHA-512"
ITERATIONS = 8192
GROUP_PREFIXES = ("statetable", "spark-kafka-")
TRANSACTION_PREFIX = "statetable."


def tls_dir(settings: StackSettings) -> Path:
    return settings.kafka_dir / "tls"


def ensure_certificates(settings: StackSettings) -> Path:
    """A CA and a broker certificate for `settings.host` (kept across `stack up`s, so clients'
    trust survives a restart); the folder."""
    folder = tls_dir(settings)
    if (folder / "broker.pem").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    san = f"subjectAltName=IP:{settings.host},DNS:localhost" if settings.host[0].isdigit() else \
        f"subjectAltName=DNS:{settings.host},DNS:localhost"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", folder / "ca.key", "-out", folder / "ca.pem",
             "-days", "3650", "-subj", "/CN=statetable-stack-ca")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", folder / "broker.key", "-out", folder / "broker.csr",
             "-subj", f"/CN={BROKER_PRINCIPAL}")
    (folder / "broker.ext").write_text(f"{san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509", "-req", "-in", folder / "broker.csr", "-CA", folder / "ca.pem", "-CAkey", folder / "ca.key",
             "-CAcreateserial", "-out", folder / "broker.crt", "-days", "825", "-extfile", folder / "broker.ext")
    # Kafka's PEM key store: the private key, then the certificate chain.
    write_private(folder / "broker.pem", (folder / "broker.key").read_text() + (folder / "broker.crt").read_text()
                  + (folder / "ca.pem").read_text())
    for name in ("ca.key", "broker.key"):
        (folder / name).chmod(0o600)
    return folder


def _openssl(*args) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise CommandFailed(f"openssl {args[0]} failed making the stack's TLS certificates: {done.stderr.strip()}")


def broker_properties(settings: StackSettings) -> list[str]:
    """The security half of each broker's server.properties."""
    folder = tls_dir(settings)
    return [
        f"sasl.enabled.mechanisms={MECHANISM}",
        f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={folder / 'broker.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={folder / 'ca.pem'}",
        "listener.name.internal.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        "ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found=false",
    ]


def admin_config(settings: StackSettings, internal_bootstrap: str) -> dict:
    """The stack's own admin client: the brokers' principal over their mutual-TLS listener."""
    folder = tls_dir(settings)
    return {"bootstrap.servers": internal_bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(folder / "ca.pem"), "ssl.certificate.location": str(folder / "broker.crt"),
            "ssl.key.location": str(folder / "broker.key"), "log_level": 2}


def client_password(settings: StackSettings) -> str:
    """statetable's SCRAM password, made once and kept in a mode-600 file."""
    path = settings.kafka_dir / ".statetable-password"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24))
    return path.read_text().strip()


def write_client_properties(settings: StackSettings) -> Path:
    """`.stack/kafka/client.properties` (mode 600): what every statetable process of the stack
    uses through STATETABLE_KAFKA_CONFIG, and the worked example of a SASL_SSL client config."""
    path = settings.kafka_client_properties
    write_private(path, "\n".join([
        "# statetable's Kafka client config for this stack (librdkafka names); mode 600: it holds a password",
        "security.protocol=SASL_SSL",
        f"sasl.mechanism={MECHANISM}",
        f"sasl.username={CLIENT_USER}",
        f"sasl.password={client_password(settings)}",
        f"ssl.ca.location={tls_dir(settings) / 'ca.pem'}",
        "",
    ]))
    return path


def ensure_users_and_acls(admin, password: str, user: str = CLIENT_USER) -> None:
    """statetable's SCRAM user and its ACLs (idempotent: `stack up` runs it on every start)."""
    from confluent_kafka.admin import (
        AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType, ScramCredentialInfo,
        ScramMechanism, UserScramCredentialUpsertion,
    )

    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS),
                                          password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)
    principal = f"User:{user}"

    def allow(kind, name, pattern, *operations):
        return [AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW) for op in operations]

    bindings = allow(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, AclOperation.READ, AclOperation.WRITE,
                     AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
    for prefix in GROUP_PREFIXES:
        bindings += allow(ResourceType.GROUP, prefix, ResourcePatternType.PREFIXED, AclOperation.READ,
                          AclOperation.DESCRIBE)
    bindings += allow(ResourceType.TRANSACTIONAL_ID, TRANSACTION_PREFIX, ResourcePatternType.PREFIXED,
                      AclOperation.WRITE, AclOperation.DESCRIBE)
    bindings += allow(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, AclOperation.IDEMPOTENT_WRITE,
                      AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
    for future in admin.create_acls(bindings).values():
        future.result(30)
