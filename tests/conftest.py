from __future__ import annotations

import json
import re
import sys

import pytest
from django.contrib.auth.models import Group, Permission, User

from workflows.specs.storage import store_spec
from workflows.timing import clock

RELEASE = {
    "name": "release",
    "description": "Build, get QA sign-off, deploy",
    "steps": [
        {"key": "build", "title": "Build", "run": {"command": ["true"]}, "max_retries": 1},
        {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
         "approval": {"group": "qa", "required": 2}},
        {"key": "deploy", "title": "Deploy", "depends_on": ["qa"],
         "run": {"command": ["true"]}},
        {"key": "notify", "depends_on": ["deploy"], "continue_on_failure": True,
         "run": {"callable": "workflows.callables.noop"}},
    ],
}


@pytest.fixture(autouse=True)
def _clock_measured_before_each_test():
    """On PostgreSQL the database clock's offset is measured by a query at most once a
    minute, in whichever request crosses the minute: taken as measured when each test
    starts, so that it never lands among the queries a test counts. Each test starts from
    the wall clock as it is: one that moved it leaves no count behind for the next (which,
    on a parallel worker, may be any test)."""
    clock.forget()
    clock.defer_measuring()


@pytest.fixture(autouse=True)
def _logs_of_this_test():
    """A failed wait shows the logs of the processes this test started, not an earlier one's."""
    from .support.processes import LOGS

    LOGS.clear()


@pytest.fixture(autouse=True)
def _no_lease_outlives_its_test():
    """The process's lease keeper renews what a test's attempts hold, on its own thread: at
    the test's end its leases are let go and a beat under way is waited for, so that none
    lands in the next test (which may have no database at all)."""
    yield
    from workflows.workers.worker import KEEPER

    from .support.processes import patience

    KEEPER.close(timeout=patience(0))


PAGE_DECISION = re.compile(r"/runs/(\d+)/steps/([^/]+)/(?:approve|reject)/(?:passkey/)?")
API_DECISION = re.compile(r"/api/runs/(\d+)/steps/([^/]+)/(?:approve|reject)")


def _shown(run_id, key) -> str:
    from workflows.models import Step

    return Step.objects.filter(run_id=run_id, key=key).values_list(
        "evidence_digest", flat=True).first() or ""


def as_shown(path: str, data, content_type: str = ""):
    """A decision as a person's page or a client posts it: with the evidence digest it was
    shown. A page renders it in a hidden field of every card, run page and bulk checkbox; an
    API client reads the run first and sends it back as `seen` (a step that cannot be read
    gets a digest that matches nothing). The gate's digest now: a page drawn now."""
    from workflows.models import Step

    if data is None:
        data = {}
    if not isinstance(data, dict):
        return data
    if "json" in content_type:
        if (found := API_DECISION.fullmatch(path)) and "seen" not in data:
            return {**data, "seen": _shown(*found.groups()) or "0" * 64}
        return data
    if (found := PAGE_DECISION.fullmatch(path)) and "evidence_digest" not in data:
        return {**data, "evidence_digest": _shown(*found.groups())}
    if path == "/inbox/decide/" and data.get("gate"):
        picked = data["gate"] if isinstance(data["gate"], list) else [data["gate"]]
        digests = dict(Step.objects.filter(pk__in=[int(pk) for pk in picked if str(
            pk).isdigit() and int(pk) < 2**63]).values_list("pk", "evidence_digest"))
        return {**{f"seen-{pk}": digest for pk, digest in digests.items()}, **data}
    return data


@pytest.fixture(autouse=True)
def _decisions_carry_what_was_shown(request, monkeypatch):
    """Every decision a test posts carries the evidence it was shown, as every door's does,
    unless the test is about one that does not (@pytest.mark.raw_decisions)."""
    if request.node.get_closest_marker("raw_decisions"):
        return
    from django.test import Client

    post = Client.post

    def posted(self, path, data=None, *args, **kwargs):
        content_type = args[0] if args else kwargs.get("content_type", "")
        return post(self, path, as_shown(path, data, content_type), *args, **kwargs)

    monkeypatch.setattr(Client, "post", posted)


def make_user(username: str, *groups: str, perms: tuple[str, ...] = (), **fields) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", "pw-" + username,
                                    **fields)
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def release_spec(db):
    return store_spec(RELEASE)[0]


@pytest.fixture
def people(db):
    """A requester/operator, two QA approvers (bob starts runs too), an outsider, a manager."""
    return {
        "alice": make_user("alice", "operators", perms=("operate_run", "add_run")),
        "bob": make_user("bob", "qa", perms=("add_run",)),
        "carol": make_user("carol", "qa"),
        "erin": make_user("erin"),
        "dave": make_user("dave", "managers"),
    }


@pytest.fixture
def waiting(release_spec, people):
    """alice's "Release 1.0" run, its build done and its QA gate waiting."""
    from workflows import engine

    run = engine.open_run(release_spec, actor=people["alice"], title="Release 1.0").run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    return run


@pytest.fixture
def consumers(settings, tmp_path):
    """Start real Huey consumer processes on the test database; each stops at teardown."""
    from .workflows.consumers import Consumer

    settings.TOLLGATE_DISPATCH = True
    settings.TOLLGATE_CALLABLES = ["workflows.callables.*", "tests.callables.*"]
    started: list[Consumer] = []

    def start(**kwargs) -> Consumer:
        consumer = Consumer(log=tmp_path / "consumer.log", **kwargs)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.stop()


# The events servers running, {port: pid}, for a test that freezes one.
EVENTS_SERVERS: dict[int, int] = {}


@pytest.fixture
def events_server():
    """The events server (tollgate.events under uvicorn) on a port of its own, on this test
    session's page versions; its port."""
    import subprocess
    import sys

    from .support.processes import ROOT, listener, port_open, stop, wait_for
    from .workflows.consumers import consumer_env

    sock = listener()
    port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tollgate.events:app", "--fd", str(sock.fileno()),
         "--log-level", "warning"], pass_fds=(sock.fileno(),),
        cwd=ROOT, env=consumer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: port_open(port) or server.poll() is not None, 60, what="uvicorn")
    assert server.poll() is None, "the events server did not start"
    EVENTS_SERVERS[port] = server.pid
    yield port
    stop(server, sig=15)
    sock.close()
    EVENTS_SERVERS.pop(port, None)


# The fault tally (tests/faults/conftest.py) of each parallel worker, added up here and printed
# once: CI counts the faults injected across its passes from this line.
def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)
    faults = sys.modules.get("tests.faults.conftest")
    if output is not None and faults is not None:
        output["fault_tally"] = json.dumps({"tally": faults.TALLY,
                                            "anomalies": faults.ANOMALIES})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    found = getattr(node, "workeroutput", {}).get("fault_tally")
    if found:
        from tests.faults import conftest as faults

        found = json.loads(found)
        for name, count in found["tally"].items():
            faults.TALLY[name] = faults.TALLY.get(name, 0) + count
        faults.ANOMALIES.extend(found["anomalies"])


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    faults = sys.modules.get("tests.faults.conftest")
    if faults is None or not (faults.TALLY["runs checked"] or faults.TALLY["faults injected"]):
        return
    terminalreporter.section("fault injection")
    terminalreporter.write_line(", ".join(f"{k}: {v}" for k, v in faults.TALLY.items()))
    for anomaly in faults.ANOMALIES:
        terminalreporter.write_line(f"  anomaly: {anomaly}")
