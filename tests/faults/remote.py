"""Work done from a process of its own, where DATABASE_URL points and with that process's own
clocks: set up and check a topology's own database (a failover pair, say: the test's Django
connection is bound to the test database), or sweep on a clock that steps.
`python -m tests.faults.remote setup|check|sweep ...` prints JSON."""

from __future__ import annotations

import json
import sys


def setup(spec: dict) -> dict:
    """Migrated already: store `spec`, make alice (starts runs) and bob (in qa), and give each
    an API token."""
    from django.contrib.auth.models import Group, Permission, User

    from workflows.models import ApiToken
    from workflows.specs.storage import store_spec

    alice = User.objects.create_user("alice", "alice@example.com", "pw-alice")
    alice.user_permissions.add(Permission.objects.get(codename="add_run"))
    bob = User.objects.create_user("bob", "bob@example.com", "pw-bob")
    bob.groups.add(Group.objects.get_or_create(name="qa")[0])
    store_spec(spec)
    return {name: ApiToken.objects.issue(user, "topology")[1]
            for name, user in (("alice", alice), ("bob", bob))}


def check(run_ids: list[int], allowed: list[str]) -> dict:
    """check_run on each run, here: the anomalies found and the runs' statuses."""
    from workflows.models import Run

    from .conftest import check_run

    statuses = dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "status"))
    anomalies = [f"run {run_id} is missing" for run_id in run_ids if run_id not in statuses]
    anomalies += [found for run_id in statuses for found in check_run(run_id, tuple(allowed))]
    return {"anomalies": anomalies, "statuses": statuses}


def sweep(seconds: float, offset_file: str, step: str) -> dict:
    """Sweep, apply deadlines and send reminders every 0.2 s for `seconds`, this process's
    wall clock stepping `step` seconds after the first round (tests/support/wallstep.c):
    how many leases it took back, gates it timed out and reminders it sent."""
    import time
    from pathlib import Path

    from workflows.recovery import sweeper
    from workflows.timing import deadlines

    done = {"expired": 0, "timed_out": 0, "reminded": 0, "stepped_by": 0.0}
    end = time.monotonic() + seconds
    before = time.time() - time.monotonic()
    while time.monotonic() < end:
        done["expired"] += sweeper.sweep().expired
        done["timed_out"] += deadlines.apply()
        done["reminded"] += deadlines.remind()
        if Path(offset_file).read_text() != step:
            Path(offset_file).write_text(step)
        time.sleep(0.2)
        done["stepped_by"] = round(time.time() - time.monotonic() - before)
    return done


if __name__ == "__main__":
    import django

    django.setup()
    what, argument = sys.argv[1], json.loads(sys.argv[2])
    act = {"setup": setup, "check": lambda a: check(**a), "sweep": lambda a: sweep(**a)}[what]
    print(json.dumps(act(argument)))
