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
    """The uids owning LISTEN sockets on `port` (any local address): the kernel's sock_diag
    answer, else /proc/net/tcp{,6}.

    A client checks before each call to its server (a reconnect may meet another listener), so
    this runs hundreds of times a minute in the batch service. The /proc tables list every
    socket of the host and cost ~16 ms to read with a thousand open (a 100-table stack has
    that); sock_diag is asked for listening sockets only and answers in well under a
    millisecond."""
    try:
        return _diag_listener_uids(port)
    except OSError:
        return _proc_listener_uids(port)


class _DiagRefused(CatalogError, OSError):
    """The kernel's sock_diag did not answer as expected: /proc/net is read instead."""


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x1, 0x300, 2, 3
_TCP_LISTEN = 10


def _diag_listener_uids(port: int) -> set[int]:
    """linux/inet_diag.h: one dump request per address family for TCP sockets in LISTEN; each
    answer is an inet_diag_msg, whose source port (big-endian) is at byte 4 and uid at 64."""
    import socket
    import struct

    uids = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
            nl.send(struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP,
                                seq, 0) + request)
            for data, body in _diag_answers(nl):
                if struct.unpack_from("!H", data, body + 4)[0] == port:
                    uids.add(struct.unpack_from("=I", data, body + 64)[0])
    return uids


def _diag_answers(nl):
    """(buffer, offset of a message's body) for each message of one dump, until its DONE."""
    import struct

    while True:
        data = nl.recv(65536)
        at = 0
        while at + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, at)
            if length < 16:
                raise _DiagRefused("sock_diag: a malformed answer")
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                raise _DiagRefused("sock_diag refused the request")
            yield data, at + 16
            at += (length + 3) & ~3


def _proc_listener_uids(port: int) -> set[int]:
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

