"""The stack's S3-compatible object store, for `stack up --workers N`.

moto's server mode: it installs from PyPI with the rest of the project (no
binary from outside the registries this machine reaches), speaks the S3 REST
API that boto3, pyarrow, delta-rs and Hadoop's s3a all use, and implements the
conditional PUT (`If-None-Match: *`) the batch log's fencing rests on. It keeps
objects in memory: a stack restart starts the cluster's store empty, which is
what a throwaway loopback cluster wants (a real deployment points
STATETABLE_STORE_URI at its own S3).

The access key pair is made on first use and kept in the store's folder (mode
600); moto accepts any pair, but every client is configured as for real S3.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
import urllib.request
from pathlib import Path

from catalog.settings import StackSettings
from deploy.processes import ManagedProcess, require_free_ports, wait_port_free, wait_ready, write_private

BUCKET = "statetable"


def process(settings: StackSettings) -> ManagedProcess:
    return ManagedProcess("s3", settings.s3_dir)


def credentials(settings: StackSettings) -> dict[str, str]:
    path = settings.s3_dir / ".credentials"
    if not path.exists():
        write_private(path, json.dumps({"key": "ST" + secrets.token_hex(8).upper(), "secret": secrets.token_urlsafe(30)}))
    made = json.loads(path.read_text())
    return {"AWS_ACCESS_KEY_ID": made["key"], "AWS_SECRET_ACCESS_KEY": made["secret"]}


def client_env(settings: StackSettings) -> dict[str, str]:
    """What every S3 client of the stack needs: boto3, pyarrow and delta-rs read these names,
    and the Spark side maps them onto s3a (spark_jobs.engine.session.spark_conf)."""
    return {**credentials(settings), "AWS_ENDPOINT_URL": settings.s3_url, "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
            "AWS_CONDITIONAL_PUT": "etag",   # delta-rs commits with If-None-Match, as the batch log does
            "STATETABLE_STORE_URI": f"s3://{BUCKET}/{settings.store_prefix}"}


def start(settings: StackSettings) -> None:
    if process(settings).is_running():
        return
    require_free_ports("s3", settings.host, settings.s3_port)
    settings.s3_dir.mkdir(parents=True, exist_ok=True)
    server = Path(sys.executable).parent / "moto_server"
    process(settings).start([str(server), "-H", settings.host, "-p", str(settings.s3_port)], env=dict(os.environ),
                            cwd=settings.s3_dir)


def is_healthy(settings: StackSettings) -> bool:
    try:
        with urllib.request.urlopen(f"{settings.s3_url}/moto-api/", timeout=1.0):
            return process(settings).is_running()
    except OSError:
        return False


def wait_healthy(settings: StackSettings, timeout: float = 60.0) -> None:
    wait_ready([process(settings)], lambda: is_healthy(settings), timeout, what=f"the S3 store at {settings.s3_url}",
               interval=0.2)
    ensure_bucket(settings)


def ensure_bucket(settings: StackSettings) -> None:
    import boto3

    env = client_env(settings)
    s3 = boto3.client("s3", endpoint_url=settings.s3_url, region_name=env["AWS_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    if BUCKET not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=BUCKET)


def stop(settings: StackSettings) -> bool:
    was_running = process(settings).stop(timeout=10)
    if not was_running:
        return False        # the port may be another process's (a stack without a store never had it)
    wait_port_free(settings.host, settings.s3_port, "the S3 store")
    return True
