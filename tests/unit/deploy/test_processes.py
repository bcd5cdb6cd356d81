"""A process counts as gone when none of its threads runs (deploy/processes.py): a SIGKILLed
JVM's main thread shows as a zombie while its other threads still exit, holding its sockets, so a
restart right after `stack kill-engine` found the Spark Connect port taken (a clean-clone run's
tests/test_engine_warmup.py)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from deploy import processes
from deploy.processes import ManagedProcess, port_in_use, wait_until

# The main thread leaves (pthread_exit) while another thread lives on: the state a SIGKILLed JVM
# passes through, held here for seconds.
MAIN_LEAVES_FIRST = ("import ctypes, threading, time; threading.Thread(target=time.sleep, args=(4,)).start(); "
                     "ctypes.CDLL(None).pthread_exit(None)")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_process_whose_main_thread_is_a_zombie_still_runs_until_its_last_thread_ends():
    child = subprocess.Popen([sys.executable, "-c", MAIN_LEAVES_FIRST])
    try:
        wait_until(lambda: _state(child.pid) == "Z", 10, 0.05, "the main thread to exit")
        assert processes._running(child.pid)          # what the pid's own state ("Z") hides
        assert child.wait(timeout=30) == 0
        assert not processes._running(child.pid)
    finally:
        child.kill()


def test_kill_returns_once_every_thread_is_gone_and_the_port_is_free(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ("import socket, threading, time\n"
              f"s = socket.create_server(('127.0.0.1', {port}))\n"
              "for _ in range(64): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
              "time.sleep(600)\n")
    proc = ManagedProcess("threads", tmp_path)
    proc.start([sys.executable, "-c", server], env={"PATH": "/usr/bin:/bin"})
    wait_until(lambda: port_in_use("127.0.0.1", port), 30, 0.05, "the server to listen")
    started = time.monotonic()
    assert proc.kill()
    assert not port_in_use("127.0.0.1", port), f"port {port} still accepts {time.monotonic() - started:.2f}s after kill"
    assert proc.pid() is None
