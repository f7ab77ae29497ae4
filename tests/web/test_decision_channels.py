"""Every decision records where it was made: the inbox card, the run page, a bulk decision,
a mailed link's page, the API (and chat, in tests/workflows/chat); the audit export, the
card's decision list and the run page say so."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.conftest import Api
from tests.conftest import RELEASE, make_user
from workflows import engine
from workflows.delivery import links
from workflows.models import Approval
from workflows.specs.storage import store_spec

pytestmark = pytest.mark.django_db


def opened(people, title):
    run = engine.open_run("release", actor=people["alice"], title=title).run
    engine.start_step(run, "build")
    engine.complete_step(run, "build")
    return run


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def test_each_entry_point_records_its_channel(people):
    store_spec(RELEASE)
    frank = make_user("frank", "qa")
    card, page, bulk, link, api = (opened(people, t) for t in ("card", "page", "bulk", "link",
                                                                "api"))
    bob = signed_in(people["bob"])
    bob.post(f"/runs/{card.pk}/steps/qa/approve/", {"via": "web", "comment": "ok"})
    bob.post(f"/runs/{page.pk}/steps/qa/approve/", {"via": "run_page"})
    bob.post("/inbox/decide/", {"gate": [bulk.steps.get(key="qa").pk], "decision": "approve"})
    gate = link.steps.get(key="qa")
    decide_page = bob.get(f"/decide/{links.decision_token(people['bob'], gate)}/")
    assert b'name="via" value="mail_link"' in decide_page.content
    bob.post(f"/runs/{link.pk}/steps/qa/approve/", {"via": "mail_link"})
    assert Api(people["carol"]).post(f"/api/runs/{api.pk}/steps/qa/approve",
                                     {"comment": "fine"}).status_code == 200
    # A made-up channel from a page is a page decision, never "chat" or "api".
    signed_in(frank).post(f"/runs/{card.pk}/steps/qa/approve/", {"via": "chat"})

    channels = {(a.step.run.title, a.user.username): a.channel
                for a in Approval.objects.select_related("step__run", "user")}
    assert channels == {("card", "bob"): "web", ("page", "bob"): "run_page",
                        ("bulk", "bob"): "bulk", ("link", "bob"): "mail_link",
                        ("api", "carol"): "api", ("card", "frank"): "web"}

    audit = bob.get(f"/runs/{api.pk}/audit/").json()
    assert [(d["user"], d["channel"]) for d in audit["decisions"]] == [("carol", "api")]
    auditor = make_user("auditor", perms=("export_audit",))
    response = signed_in(auditor).get("/audit/?format=csv")
    csv = b"".join(response.streaming_content).decode().splitlines()
    assert "channel" in csv[0] and any(",bulk," in row for row in csv)
    run_page = bob.get(f"/runs/{page.pk}/").content.decode()
    assert "via run page" in run_page
    assert "via run page" in signed_in(people["carol"]).get("/").content.decode()
