"""An upgrade while runs are under way, as an operator rolls one out: the image of the commit
before the newest migration runs the web app and a consumer; runs start; the new image's
migration runs beside them, then the new consumer and web app replace the old ones. Every
run completes, and no step runs to its end twice."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ..support.attempts import logged_shell, overlaps, ran_to_the_end, read
from ..support.containers import ROOT, build
from ..support.processes import wait_for
from .conftest import Api, people, serve
from .test_image import load, status


def earlier_commit() -> str:
    """The commit before the one that added the newest migration: upgrading from it runs a
    migration while the old code's processes still work."""
    newest = sorted((ROOT / "workflows" / "migrations").glob("0*.py"))[-1]
    found = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            str(newest.relative_to(ROOT))], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    if not found:
        pytest.fail(f"git history naming {newest.name} is needed (a full clone)")
    return subprocess.run(["git", "rev-parse", f"{found[-1]}^"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def earlier_image(tmp_path_factory):
    commit = earlier_commit()
    tree = tmp_path_factory.mktemp("earlier")
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    # Built the way this release builds (the image is new: the older tree has no recipe).
    for name in ("Containerfile", ".containerignore"):
        shutil.copy(ROOT / name, tree / name)
    return build(f"localhost/tollgate:earlier-{commit[:10]}", tree)


def test_an_upgrade_under_way_loses_nothing_and_runs_nothing_twice(stack, earlier_image,
                                                                   tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    log = logs / "attempts.log"
    mounts = (f"{logs}:/logs",)
    stack.run("python", "manage.py", "migrate", "--noinput", image=earlier_image)
    old_url = serve(stack, image=earlier_image, role="web-old")
    alice, _ = people(stack, old_url, image=earlier_image)
    new_image, stack.image = stack.image, earlier_image
    load(stack, tmp_path, {"name": "rolling", "steps": [
        {"key": f"s{i}", "max_retries": 3, **({"depends_on": [f"s{i - 1}"]} if i else {}),
         "run": {"shell": logged_shell("/logs/attempts.log", 1.5)}} for i in range(3)]})
    stack.image = new_image
    old = stack.start("consumer-old", "python", "manage.py", "run_huey", "--workers", "2",
                      image=earlier_image, user="0:0", mounts=mounts,
                      TOLLGATE_COMMAND_USER="tollgate-steps")
    runs = [alice.post("/api/runs", {"spec": "rolling"}, expect=201)["id"] for _ in range(4)]
    wait_for(lambda: len(read(log)) >= 2, 120, 0.1, what="the old consumer to be at work")
    # The new release: its migration first, beside the old processes; then its processes.
    stack.run("python", "manage.py", "migrate", "--noinput")
    stack.start("consumer-new", "python", "manage.py", "run_huey", "--workers", "2",
                user="0:0", mounts=mounts, TOLLGATE_COMMAND_USER="tollgate-steps")
    stack.stop(old, seconds=30)
    alice = Api(serve(stack, role="web-new"), alice.token)  # the new web app answers now
    for run_id in runs:
        wait_for(lambda run_id=run_id: status(alice, run_id)["status"] == "completed",
                 300, 0.5, what=f"run {run_id} to complete after the upgrade")
    ended = ran_to_the_end(log)
    assert overlaps(log) == [], overlaps(log)
    assert len(ended) == 12 and set(ended.values()) == {1}, ended
