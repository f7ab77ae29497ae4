from __future__ import annotations

import json
import sys

import pytest
from django.contrib.auth.models import Group, Permission, User

from workflows import clock
from workflows.specs.storage import store_spec

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
    starts, so that it never lands among the queries a test counts."""
    clock.defer_measuring()


@pytest.fixture(autouse=True)
def _logs_of_this_test():
    """A failed wait shows the logs of the processes this test started, not an earlier one's."""
    from .support.processes import LOGS

    LOGS.clear()


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
