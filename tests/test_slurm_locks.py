"""A store on a file system without file locks (Lustre mounted with `noflock`, as some SLURM clusters' scratch
is) is refused in one line before the sweep starts Ray: the file system here is a real FUSE mount whose lock
calls fail with ENOSYS, as Lustre's do (support/nolockfs.py, under Debian's Python and fusepy), and the
sweep's store lies on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.configs import FOUR_TRIALS
from support.repo import REPO, subprocess_env

from tracking.sqlite_guard import locks_refused

SERVER = REPO / "tests" / "support" / "nolockfs.py"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-fusepy


def fuse_missing() -> str | None:
    """Why this machine cannot mount the FUSE file system, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    found = (
        subprocess.run([PYTHON, "-c", "import fusepy"], capture_output=True)
        if os.path.exists(PYTHON)
        else None
    )
    if found is None or found.returncode != 0:
        return "no fusepy for /usr/bin/python3: apt-get install python3-fusepy (.ci/run does)"
    return None


@pytest.fixture
def no_locks(tmp_path: Path):
    """A folder on a mounted file system that refuses every fcntl lock (ENOSYS), unmounted after the test."""
    if why := fuse_missing():
        pytest.skip(why)
    root, mount = tmp_path / "root", tmp_path / "mount"
    root.mkdir()
    mount.mkdir()
    server = subprocess.Popen([PYTHON, str(SERVER), str(root), str(mount)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            assert server.poll() is None, f"the FUSE server exited {server.returncode}"
            if time.monotonic() > deadline:
                pytest.skip("the FUSE file system did not mount (no permission to mount here?)")
            time.sleep(0.1)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def test_the_lock_probe_tells_a_file_system_without_locks_from_one_with_them(no_locks, tmp_path):
    assert locks_refused(no_locks) == "lockf: Function not implemented"
    assert locks_refused(tmp_path) is None
    assert list(no_locks.iterdir()) == []  # its probe file removed


@pytest.mark.slow
def test_a_sweep_refuses_a_store_on_a_file_system_without_locks_before_ray_starts(no_locks):
    uri = f"sqlite:///{no_locks}/mlflow.db"
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", *FOUR_TRIALS, f"tracking.uri={uri}"],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = done.stderr.strip().splitlines()
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(errors) == 1 and "refuses file locks (lockf: Function not implemented)" in errors[0], errors
    assert "Ray" not in done.stdout + done.stderr  # refused before Ray started: no trial ran
    assert list(no_locks.iterdir()) == []  # no store begun
