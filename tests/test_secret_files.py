"""A deployment's key files: made once, readable by their owner alone; one made by root (a
container's consumer) belongs to the owner of its folder, the web app's user, who reads it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tollgate.secret_files import made_once


def test_a_key_is_made_once_and_kept(tmp_path):
    path = tmp_path / "keys" / "key.pem"
    assert made_once(path, lambda: b"first") == b"first"
    assert made_once(path, lambda: b"second") == b"first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file for another user needs root")
def test_a_key_root_makes_belongs_to_its_folders_owner_who_reads_it():
    top = Path(tempfile.mkdtemp())  # /tmp: every account may pass through it
    try:
        os.chmod(top, 0o755)
        folder = top / "data"
        folder.mkdir()
        os.chown(folder, 4321, 4321)
        path = folder / "vapid-key.pem"
        made_once(path, lambda: b"secret")
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4321)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        # The folder's owner (the web app's user) reads it; another account does not.
        as_owner = subprocess.run(["cat", str(path)], user=4321, group=4321,
                                  capture_output=True, text=True)
        assert as_owner.returncode == 0 and as_owner.stdout == "secret", as_owner.stderr
        other = subprocess.run(["cat", str(path)], user=4322, group=4322,
                               capture_output=True, text=True)
        assert other.returncode != 0 and "Permission denied" in other.stderr
    finally:
        shutil.rmtree(top)
