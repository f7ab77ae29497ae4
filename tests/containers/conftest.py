"""The image, as an operator runs it: built from the Containerfile on the offline base and
started with podman against PostgreSQL and Redis on this machine (`make test-containers`,
CI's container pass). Skipped unless TOLLGATE_CONTAINER_TESTS=1."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
import requests

from ..browser.conftest import browser  # noqa: F401  (Debian's chromium, as in the browser tests)
from ..support.containers import Stack, build
from ..support.processes import free_port, wait_for

pytestmark = pytest.mark.container

if os.environ.get("TOLLGATE_CONTAINER_TESTS") != "1" or not shutil.which("podman"):
    collect_ignore_glob = ["test_*.py"]

POSTGRES = "postgres://postgres@127.0.0.1:5432"
METRICS_TOKEN = "metrics-token-for-the-container-tests"


@pytest.fixture(scope="session")
def image():
    return build("localhost/tollgate:test")


def psql(sql: str) -> None:
    subprocess.run(["psql", "-q", "-h", "127.0.0.1", "-U", "postgres", "-c", sql, "postgres"],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture
def database():
    """A PostgreSQL database and a Redis queue of this test's own; the environment every
    container of the test gets."""
    name = f"tg_container_{uuid.uuid4().hex[:8]}"
    psql(f"CREATE DATABASE {name}")
    yield {
        "DATABASE_URL": f"{POSTGRES}/{name}",
        "TOLLGATE_REDIS_URL": "redis://127.0.0.1:6379/9",
        "TOLLGATE_HUEY_NAME": name,
        "SECRET_KEY": f"container-test-{uuid.uuid4().hex}{uuid.uuid4().hex}",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "TOLLGATE_SSL_REDIRECT": "0",
        "TOLLGATE_SECURE_COOKIES": "0",
        "TOLLGATE_METRICS_TOKEN": METRICS_TOKEN,
        "TOLLGATE_LEASE_SECONDS": "3",
        "TOLLGATE_SWEEP_SECONDS": "1",
        "TOLLGATE_KILL_GRACE_SECONDS": "2",
        "LOG_LEVEL": "WARNING",
    }
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def stack(image, database):
    stack = Stack(image, database)
    yield stack
    stack.close()


class Api:
    """The JSON API over HTTP with a person's token."""

    def __init__(self, url: str, token: str):
        self.url, self.token, self.session = url, token, requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str) -> dict:
        answer = self.session.get(self.url + path, timeout=30)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
        return answer.json()

    def post(self, path: str, body: dict, expect: int = 200) -> dict:
        answer = self.session.post(self.url + path, json=body, timeout=30)
        assert answer.status_code == expect, (path, answer.status_code, answer.text[:500])
        return answer.json()


PEOPLE = """
from django.contrib.auth.models import Group, Permission, User
alice = User.objects.create_user("alice", "alice@example.com", "pw-alice")
alice.user_permissions.add(*Permission.objects.filter(codename__in=["add_run"]))
bob = User.objects.create_user("bob", "bob@example.com", "pw-bob")
bob.groups.add(Group.objects.get_or_create(name="qa")[0])
"""


def serve(stack: Stack, *, image: str = "", role: str = "web") -> str:
    """The web app in a container of its own, answering; its address."""
    port = free_port()
    name = stack.start(role, image=image, PORT=str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{url}/readyz"), 60, 0.25, what=f"{name} to be ready",
             log=None)
    return url


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def people(stack: Stack, url: str, *, image: str = "") -> tuple[Api, Api]:
    """alice (starts runs) and bob (qa), with API tokens made by the image's commands."""
    stack.run("python", "manage.py", "shell", "-c", PEOPLE, image=image)
    tokens = [stack.run("python", "manage.py", "create_token", who, image=image).split()[-1]
              for who in ("alice", "bob")]
    return Api(url, tokens[0]), Api(url, tokens[1])


GATED = PEOPLE + """
from workflows.specs.storage import store_spec
store_spec({"name": "gated", "steps": [
    {"key": "build", "run": {"command": ["id", "-u"]}},
    {"key": "qa", "depends_on": ["build"], "approval": {"group": "qa"}},
    {"key": "ship", "depends_on": ["qa"], "run": {"command": ["true"]}}]})
"""


def through_the_gate(manage, url: str) -> None:
    """alice and bob made with `manage` (a management command in the stack: its output); a
    run started by alice over the API, its gate approved by bob over HTTP, finished by a
    consumer, its command run as tollgate-steps."""
    manage("shell", "-c", GATED)
    alice, bob = (Api(url, manage("create_token", who).split()[-1]) for who in ("alice", "bob"))
    run = alice.post("/api/runs", {"spec": "gated"}, expect=201)["id"]
    gate = wait_for(lambda: next((s for s in alice.get(f"/api/runs/{run}")["steps"]
                                  if s["status"] == "waiting_approval"), None),
                    120, 0.5, what="the gate to open")
    bob.post(f"/api/runs/{run}/steps/qa/approve", {"seen": gate["evidence_digest"]})
    wait_for(lambda: alice.get(f"/api/runs/{run}")["status"] == "completed", 120, 0.5,
             what="a consumer to finish the run")
    build = next(c for c in alice.get(f"/api/runs/{run}/timeline")
                 if c["step"] == "build" and c["kind"] == "step_completed")
    assert build["evidence"]["stdout"] == "10002\n", build  # as tollgate-steps
