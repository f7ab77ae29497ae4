"""Open pages poll their versions (workflows.reads.live): nothing changed is answered without the
session or the database; every change that can alter a page rings it."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.conftest import make_user
from tollgate.wsgi import application
from workflows import engine
from workflows.models import Preference
from workflows.reads import live
from workflows.specs.storage import store_spec


def gate_spec(group: str):
    return store_spec({"name": f"gate-{group}", "steps": [
        {"key": "gate", "approval": {"group": group, "required": 2}}]})[0]


def versions(body: str) -> dict:
    watch = re.search(r'name="watch" value="([^"]*)"', body)[1]
    seen = re.search(r'name="seen" value="([^"]*)"', body)[1]
    return {"watch": watch, "seen": seen}


def through_wsgi(monkeypatch, path: str, params: dict) -> tuple[str, int]:
    """A poll as gunicorn hands it over: what answered it ("Django" if the shortcut did
    not), and the queries it took."""
    import tollgate.wsgi

    def django(environ, start_response):
        start_response("299 Django", [])
        return []

    monkeypatch.setattr(tollgate.wsgi, "django_application", django)
    environ = RequestFactory().get(path + "?" + urlencode(params, doseq=True)).environ
    answer = {}
    with CaptureQueriesContext(connection) as queries:
        application(environ, lambda status, headers: answer.setdefault("s", status))
    return ("Django" if answer["s"] == "299 Django" else answer["s"]), len(queries)


@pytest.fixture
def inbox(client, people, django_capture_on_commit_callbacks):
    """carol's open inbox (qa), with one qa gate waiting; rings run as they would."""
    with django_capture_on_commit_callbacks(execute=True):
        run = engine.open_run(gate_spec("qa"), actor=people["alice"]).run
    client.force_login(people["carol"])
    page = versions(client.get("/").content.decode())
    assert page["seen"], "the versions can be read"
    return run, page


def poll(client, page: dict, **extra):
    return client.get("/", {"poll": 1, **page, **extra}, HTTP_HX_REQUEST="true")


def test_nothing_changed_is_answered_before_the_session_and_the_database(inbox, monkeypatch):
    _, page = inbox
    assert through_wsgi(monkeypatch, "/", {"poll": 1, **page, "have": "1:1.0"}) == (
        "204 No Content", 0)
    # Without the versions, or with a token of another kind, Django answers.
    assert through_wsgi(monkeypatch, "/", {"poll": 1})[0] == "Django"
    assert through_wsgi(monkeypatch, "/", {"poll": 1, "watch": "forged:x:y",
                                           "seen": page["seen"]})[0] == "Django"
    # Only the pages that poll are answered so, each with its own token: any other
    # address, or this token on a run page, is Django's.
    assert through_wsgi(monkeypatch, "/api/runs", {**page})[0] == "Django"
    assert through_wsgi(monkeypatch, "/runs/1/", {**page})[0] == "Django"


def test_a_decision_on_a_gate_rings_the_inboxes_of_its_group(client, people, inbox, monkeypatch,
                                                              django_capture_on_commit_callbacks):
    run, page = inbox
    with django_capture_on_commit_callbacks(execute=True):
        engine.approve(run, "gate", user=people["bob"])
    assert not live.unchanged(page["watch"], page["seen"], "/")
    assert through_wsgi(monkeypatch, "/", {"poll": 1, **page})[0] == "Django"
    response = poll(client, page, have=f"{run.steps.get().pk}:1.0")
    assert response.status_code == 200 and "1 of 2" in response.content.decode()
    # The answer gives the versions to send next; with them, nothing has changed.
    fresh = {"watch": response["Tollgate-Watch"], "seen": response["Tollgate-Seen"]}
    assert fresh["seen"] != page["seen"] and live.unchanged(fresh["watch"], fresh["seen"], "/")


def test_a_new_gate_rings_its_group_and_no_other(client, people, inbox,
                                                 django_capture_on_commit_callbacks):
    _, page = inbox
    make_user("olga", "ops")
    with django_capture_on_commit_callbacks(execute=True):
        engine.open_run(gate_spec("ops"), actor=people["alice"])
    assert live.unchanged(page["watch"], page["seen"], "/")  # carol is not in ops
    with django_capture_on_commit_callbacks(execute=True):
        engine.open_run(gate_spec("qa"), actor=people["alice"])
    assert not live.unchanged(page["watch"], page["seen"], "/")


def test_joining_a_group_or_a_delegation_rings_the_person(client, people, inbox,
                                                         django_capture_on_commit_callbacks):
    _, page = inbox
    with django_capture_on_commit_callbacks(execute=True):
        people["carol"].groups.add(Group.objects.get_or_create(name="ops")[0])
    assert not live.unchanged(page["watch"], page["seen"], "/")
    # erin becomes dave's delegate: erin's inbox changes, though no gate did.
    client.force_login(people["erin"])
    erins = versions(client.get("/").content.decode())
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        Preference.objects.create(user=people["dave"], delegate=people["erin"],
                                  away_from=now, away_until=now + timedelta(days=1))
    assert not live.unchanged(erins["watch"], erins["seen"], "/")


def test_a_run_page_is_rung_by_each_transition_of_its_run(client, people, waiting,
                                                          django_capture_on_commit_callbacks):
    client.force_login(people["alice"])
    body = client.get(f"/runs/{waiting.pk}/").content.decode()
    page, have = versions(body), re.findall(r'name="have" value="([^"]*)"', body)
    seq = waiting.checkpoint_seq
    response = client.get(f"/runs/{waiting.pk}/", {"seq": seq, **page}, HTTP_HX_REQUEST="true")
    assert response.status_code == 204
    with django_capture_on_commit_callbacks(execute=True):
        engine.approve(waiting, "qa", user=people["bob"])
    assert not live.unchanged(page["watch"], page["seen"], f"/runs/{waiting.pk}/")
    response = client.get(f"/runs/{waiting.pk}/", {"seq": seq, **page, "have": have},
                          HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "bob" in response.content.decode()


def test_a_token_is_the_viewers_own_and_expires(client, people, inbox, settings, monkeypatch):
    run, page = inbox
    client.force_login(people["bob"])  # carol's token in bob's poll: the database decides
    response = poll(client, page, have=f"{run.steps.get().pk}:1.0")
    assert response.status_code == 204 and response["Tollgate-Watch"] != page["watch"]
    assert not live.unchanged(page["watch"] + "x", page["seen"], "/")
    settings.TOLLGATE_LIVE_MAX_AGE = -1  # older than it may be
    assert not live.unchanged(page["watch"], page["seen"], "/")
    assert through_wsgi(monkeypatch, "/", {"poll": 1, **page})[0] == "Django"


def test_versions_that_cannot_be_read_leave_the_page_to_the_database(client, people, inbox,
                                                                     monkeypatch):
    _, page = inbox

    class Gone:
        def read(self, keys):
            raise ConnectionError("Redis is away")

        write = read

    monkeypatch.setattr(live, "_store", lambda: Gone())
    live.ring(["u:1"])  # says so in the log, and goes on
    assert not live.unchanged(page["watch"], page["seen"], "/")
    body = client.get("/").content.decode()
    assert versions(body)["seen"] == "" and 'hx-trigger="every 5s"' in body


def test_versions_no_page_can_watch_are_pruned(settings):
    """The periodic prune drops versions older than any watch list (Redis expires them)."""
    if settings.TOLLGATE_LIVE_REDIS_URL:
        pytest.skip("Redis expires page versions itself")
    live.ring(["r:999999", "r:999998"])
    store = live._store()
    store.db().execute("UPDATE versions SET at = at - ? WHERE key = 'r:999999'",
                       [live.TTL + 60])
    assert live.forget_old() >= 1
    assert store.read(["r:999999", "r:999998"])[0] == ""
    assert store.read(["r:999998"])[0] != ""


def test_a_reassigned_gate_rings_whom_it_left_and_whom_it_reached(
        client, people, inbox, django_capture_on_commit_callbacks):
    """carol's group loses the gate to erin's (an operator's reassignment): both inboxes
    are told, qa's from the checkpoint's evidence, since the rule now names another group."""
    from django.contrib.auth.models import Group

    run, carols = inbox
    area = Group.objects.create(name="area")
    for name in ("erin", "dave"):  # two, as the gate needs two approvals
        people[name].groups.add(area)
    client.force_login(people["erin"])
    erins = versions(client.get("/").content.decode())
    with django_capture_on_commit_callbacks(execute=True):
        engine.reassign_gate(run, "gate", actor=people["alice"], group="area",
                             reason="erin's team owns this area")
    assert not live.unchanged(carols["watch"], carols["seen"], "/")
    assert not live.unchanged(erins["watch"], erins["seen"], "/")


def test_a_page_redrawn_by_a_button_polls_from_its_own_address(client, people, waiting,
                                                                monkeypatch):
    """The run body an Approve press sends back carries versions made for the run page (not
    for the address pressed), so its next quiet poll is answered before Django."""
    client.force_login(people["bob"])
    body = client.post(f"/runs/{waiting.pk}/steps/qa/approve/", HTTP_HX_REQUEST="true")
    page = versions(body.content.decode())
    assert through_wsgi(monkeypatch, f"/runs/{waiting.pk}/",
                        {"seq": waiting.checkpoint_seq, **page})[0] == "204 No Content"


@pytest.mark.django_db
def test_the_transitions_of_one_transaction_ring_once_together(
        monkeypatch, django_capture_on_commit_callbacks):
    """A worker's group commit, or a completion and the claim chained on it, is one write
    of the versions, once it commits."""
    from workflows.engine import batches

    spec = store_spec({"name": "one", "steps": [
        {"key": "s", "run": {"callable": "workflows.callables.noop"}}]})[0]
    first, second = engine.open_run(spec).run, engine.open_run(spec).run
    rung = []
    monkeypatch.setattr(live, "ring", lambda keys: rung.append(sorted(keys)))
    keys = sorted([live.run_key(first.pk), live.run_key(second.pk)])
    with django_capture_on_commit_callbacks(execute=True):
        steps = batches.claim_many(engine.Chain("w", 30), 8)
    assert len(steps) == 2 and rung == [keys]
    reports = [batches.Report(s.run_id, s.key, s.lease_token, "worker w", ok=True)
               for s in steps]
    with django_capture_on_commit_callbacks(execute=True):
        batches.record_many(reports)
    assert rung == [keys, keys]


def test_a_versions_file_replaced_as_it_is_opened_is_not_read_as_it_was(tmp_path, monkeypatch):
    """The file replaced just after the connection opened it: the connection reads the old
    file, so the identity kept must be the one seen before connecting (the next read then
    finds the new file), not a later look that names the new one."""
    import os
    import sqlite3

    path = str(tmp_path / "versions.sqlite3")
    live.FileVersions(path).write(["r:1"], "old")
    store = live.FileVersions(path)
    connect, stat, opened = sqlite3.connect, os.stat, []

    def connecting(*args, **kwargs):
        opened.append(True)
        return connect(*args, **kwargs)

    def looking(name, *args, **kwargs):
        if opened and name == path:  # the first look at the path since it was opened
            opened.clear()
            os.replace(path, path + ".away")
            with connect(path) as fresh:
                fresh.execute("CREATE TABLE versions (key TEXT PRIMARY KEY, value TEXT, at REAL)")
                fresh.execute("INSERT INTO versions VALUES ('r:1', 'new', 0)")
        return stat(name, *args, **kwargs)

    monkeypatch.setattr(live.sqlite3, "connect", connecting)
    monkeypatch.setattr(live.os, "stat", looking)
    store.read(["r:1"])
    assert store.read(["r:1"]) == ["new"]
