"""Files that hold a deployment's keys (the audit's signing key, the push key): made on first
use where missing, readable by their owner alone, and when processes race to make one, all
of them use the first one written. A key made by root (a container's consumer, which runs
as root only to start commands as another account) belongs to whoever owns its folder (the
data volume's owner, the web app's user), so that the web app reads it too."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def made_once(path: Path, make: Callable[[], bytes]) -> bytes:
    """The file's bytes, after writing `make()` to it (mode 0600) if it did not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        content = make()
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: use theirs
        else:
            if os.geteuid() == 0:
                folder = path.parent.stat()
                os.fchown(descriptor, folder.st_uid, folder.st_gid)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
    return path.read_bytes()
