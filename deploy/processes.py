"""Background processes owned by the stack: started with a pid file and a log,
stopped by that pid only.

Each process leads its own session (process group), so stopping it also stops
the workers it forked (Airflow's LocalExecutor, Spark drivers) and nothing
else on the machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from deploy.errors import PortTaken, ProcessExited, WaitTimedOut


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    run_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The recorded pid if that same process is still alive, else None.

        The pid file holds the pid and the process's start time: after a reboot or a crash the
        pid may belong to a stranger, whose process group `stop` must never signal."""
        try:
            fields = self.pid_file.read_text().split()
            pid = int(fields[0])
            started = int(fields[1]) if len(fields) > 1 else None
        except (FileNotFoundError, ValueError, IndexError):
            return None
        stat = _stat(pid)
        if stat is None or stat["state"] == "Z":
            return None
        if started is not None and stat["started"] != started:
            return None         # the pid was reused by another process
        if started is None and stat["pgrp"] != pid:
            return None         # an old pid file: ours led its own process group
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(self, cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> int:
        if (pid := self.pid()) is not None:
            return pid
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            log.write(f"\n--- start {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n".encode())
            # umask 077: everything a stack process writes (state, snapshots, batch log, logs,
            # Airflow's and Kafka's files) is its owner's alone; the query API's authorisation is
            # not to be walked around by reading the files under it.
            proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, umask=PRIVATE_UMASK,
            )
        stat = _stat(proc.pid)
        self.pid_file.write_text(f"{proc.pid} {stat['started'] if stat else ''}".strip())
        return proc.pid

    def stop(self, timeout: float = 20.0, sig: int = signal.SIGTERM) -> bool:
        """`sig` (SIGTERM) to the process group, SIGKILL after `timeout`. True if it was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.1)
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
            while _group_alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self, timeout: float = 30.0) -> bool:
        """SIGKILL the process's whole session at once, as a crash would (a failure drill): the
        process led a session of its own, so its Python daemon's workers, outside its process
        group, go too. True if it was running."""
        from state.faults import kill_session, session_pids

        pid = self.pid()
        if pid is None:
            return False
        kill_session(pid)
        wait_until(lambda: not any(map(_running, session_pids(pid))), timeout, 0.05,
                   f"{self.name} (pid {pid}) and its session to die")
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """True while any process of the group has a thread running (an unreaped zombie does not count)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat["pgrp"] == pgid \
                and _running(int(entry.name)):
            return True
    return False


def _running(pid: int) -> bool:
    """True while any thread of `pid` runs. A SIGKILLed JVM's main thread shows as a zombie while
    its other threads still exit, and they hold its sockets: a port checked then is still taken
    (a restarted Spark Connect server found its port in use after `stack kill-engine`)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any((fields := _stat_fields(f"/proc/{pid}/task/{tid}/stat")) and fields[0] not in ("Z", "X")
               for tid in threads)


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command name (which may hold spaces and
    parentheses), or None once the process or thread is gone."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _stat(pid: int) -> dict | None:
    """State, process group and start time (clock ticks since boot) from /proc, or None if gone."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return None if fields is None else {"state": fields[0], "pgrp": int(fields[2]), "started": int(fields[19])}


def port_in_use(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def require_free_ports(what: str, host: str, *ports: int) -> None:
    """Refuse to start on a port someone else holds, rather than silently
    talking to a stranger's server (an orphan from another checkout or run)."""
    taken = [p for p in ports if port_in_use(host, p)]
    if taken:
        raise PortTaken(
            f"{what}: {host}:{','.join(map(str, taken))} already in use by another process; stop it "
            f"(statetable stack down in its checkout) or choose other ports (see README, Ports)"
        )


def wait_until(check, timeout: float, interval: float = 0.5, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ProcessExited:
            raise
        except Exception as exc:  # health probes fail in many ways while a server starts
            last_error = exc
        time.sleep(interval)
    raise WaitTimedOut(f"{what} not reached within {timeout:.0f}s (last error: {last_error})")


def wait_ready(procs: list[ManagedProcess], ready, timeout: float, what: str, interval: float = 0.5) -> None:
    """Poll `ready` until it holds; fail at once, with its log's tail, when one of `procs` exits."""
    def check() -> bool:
        for proc in procs:
            if not proc.is_running():
                raise ProcessExited(f"{proc.name} exited; last log lines:\n{proc.log_tail()}")
        return ready()

    wait_until(check, timeout, interval=interval, what=what)


def wait_port_free(host: str, port: int, what: str) -> None:
    """A stopped JVM or server lets go of its listening socket a moment after its process is gone."""
    wait_until(lambda: not port_in_use(host, port), 15, interval=0.1,
               what=f"port {port} to be free after {what} stopped")


PRIVATE_UMASK = 0o077


def stop_server(proc: ManagedProcess, host: str, port: int, what: str, timeout: float = 20.0) -> bool:
    """Stop a server by its pid, then wait until its port is free (a next start binds it at once).
    True if it was running."""
    if not proc.stop(timeout=timeout):
        return False
    wait_port_free(host, port, what)
    return True


def made_secret(path: Path) -> str:
    """The random secret kept in `path` (mode 600), made on first use: every stack secret that
    nobody chooses (tokens, passwords, the cluster's shared secret) comes from here."""
    import secrets

    if not path.exists() or not path.read_text().strip():
        write_private(path, secrets.token_urlsafe(32))
    return path.read_text().strip()


def write_private(path: Path, text: str) -> None:
    """A secret's file, readable by its owner only from before the secret is in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)          # touch keeps the mode of a file that already exists
    path.write_text(text)
