"""Whether the process listening on a loopback port is this user's, before a secret goes to it.

The stack's servers listen on loopback ports that any local user may bind while they are down
(the stack stopped, an engine restarting, the seconds of PostgreSQL's first start). A client
that only checks that something accepts a connection would hand the Spark Connect token or the
Airflow admin password to whoever listens there, and with either a local user runs code as the
stack's user. On Linux the kernel's socket tables name each LISTEN socket's owner, so a client
asks them first. Remote hosts cannot be checked this way; there TLS is the answer.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from catalog.errors import CatalogError

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"


class ForeignListener(CatalogError, PermissionError):
    """A port the stack's server should hold is held by another user's process (or by none)."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listener_uids(port: int) -> set[int]:
    """The uids owning LISTEN sockets on `port` (any local address)."""
    uids = set()
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                uids.add(int(fields[7]))
    return uids


def check_ours(host: str, port: int, what: str, absent_ok: bool = False) -> None:
    """Raise ForeignListener unless every LISTEN socket on loopback `port` is this user's (or,
    with `absent_ok`, there is none: a connection then fails, and nothing receives a secret). A
    non-loopback `host` is not checked; on a system without /proc/net neither."""
    if not is_loopback(host) or not any(t.exists() for t in _TABLES):
        return
    uids = listener_uids(port)
    me = os.geteuid()
    if not uids and absent_ok:
        return
    if not uids:
        raise ForeignListener(f"nothing listens on {host}:{port} ({what}): is it up? (`statetable stack status`)")
    if uids != {me}:
        others = sorted(u for u in uids if u != me)
        raise ForeignListener(f"{host}:{port} is held by another user's process (uid {', '.join(map(str, others))}), "
                              f"not {what}: no secret is sent to it; stop that process or move the stack's port")

