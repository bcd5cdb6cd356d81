"""`stack down` signals only the stack's own processes: a pid file whose pid now belongs to
another process (reused after a reboot or crash) must not get that process's group killed."""
from __future__ import annotations

import subprocess
import sys

from deploy.processes import ManagedProcess


def _sleeper(**kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw)


def test_stop_kills_what_it_started_and_never_a_stranger_behind_a_reused_pid(tmp_path):
    ours = ManagedProcess("ours", tmp_path)
    pid = ours.start([sys.executable, "-c", "import time; time.sleep(60)"], env={})
    assert ours.pid() == pid and len(ours.pid_file.read_text().split()) == 2
    assert ours.stop(timeout=5) is True
    assert ours.pid() is None

    stranger = _sleeper(start_new_session=True)
    try:
        # The same pid recorded with another start time: the pid was reused.
        ours.pid_file.write_text(f"{stranger.pid} 1")
        assert ours.pid() is None and ours.stop(timeout=1) is False
        # An old-format pid file naming a process that does not lead its group.
        follower = _sleeper()
        try:
            ours.pid_file.write_text(str(follower.pid))
            assert ours.pid() is None and ours.stop(timeout=1) is False
            assert follower.poll() is None
        finally:
            follower.kill()
            follower.wait()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
