"""The seal chain's head, kept outside the database (TOLLGATE_AUDIT_HEAD_FILE): each whole
check by verify_audit that holds writes how many seals there were and the newest one's
digest, and the next check refuses a chain that no longer has that seal or is shorter.
Whoever deletes every seal (TRUNCATE fires no row trigger) and rewrites the runs then faces
a file they may not reach; keep it where database users cannot write (or ship it to
monitoring: verify_audit prints it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings

from ..models import AuditSeal


def _path() -> Path | None:
    where = settings.TOLLGATE_AUDIT_HEAD_FILE
    return Path(where) if where else None


def problems() -> list[tuple[int, int, str]]:
    """The seal chain against the head the last whole check kept ([] when none was kept)."""
    path = _path()
    if path is None or not path.exists():
        return []
    kept = json.loads(path.read_text())
    count = AuditSeal.objects.count()
    if count < kept["seals"] or not AuditSeal.objects.filter(digest=kept["digest"]).exists():
        return [(0, 0, f"the seal chain is shorter than when it was last verified "
                       f"({count} seal(s) now, {kept['seals']} then; the newest then, "
                       f"{kept['digest'][:16]}…, is gone or the chain lost seals): seals were "
                       "deleted")]
    return []


def keep() -> None:
    """Write the head the chain has now (after a whole check that held)."""
    path = _path()
    if path is None:
        return
    newest = AuditSeal.objects.order_by("-pk").values_list("digest", flat=True).first()
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_text(json.dumps({"seals": AuditSeal.objects.count(), "digest": newest or ""}))
    draft.replace(path)
