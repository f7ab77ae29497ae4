"""Each way around the front doors that was found, shut: one test per reproduction."""

from __future__ import annotations

import pytest
from django.test import Client

from workflows import engine
from workflows.models import ApiToken, Run, Step
from workflows.specs.storage import store_spec

from ..conftest import make_user
from .helpers import work

pytestmark = pytest.mark.django_db

SCAN = {"name": "scanned", "steps": [
    {"key": "scan", "title": "Security scan", "run": {"callable": "workflows.callables.noop"}},
    {"key": "agent", "title": "Agent review", "depends_on": ["scan"]},
    {"key": "ship", "title": "Ship it", "depends_on": ["agent"], "approval": {"group": "qa"}},
]}


@pytest.fixture
def rita(db):
    return make_user("rita", perms=("add_run",))


def api(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.objects.issue(user, 't')[1]}")


class TestTransitionReportsOnlyWaitSteps:
    @pytest.mark.parametrize("key", ["scan", "ship"])
    def test_a_worker_step_or_gate_answers_409_with_nothing_recorded(self, rita, key):
        run = engine.open_run(store_spec(SCAN)[0], actor=rita).run
        response = api(rita).post(f"/api/runs/{run.pk}/transition", {
            "step": key, "step_status": "completed", "summary": "scan passed",
            "evidence": {"exit_code": 0, "stdout": "0 findings"}},
            content_type="application/json")
        assert response.status_code == 409, response.content
        step = Step.objects.get(run=run, key=key)
        assert step.status == "pending" and step.last_summary == ""
        assert Run.objects.get(pk=run.pk).checkpoint_seq == 1

    def test_an_operator_is_refused_too_and_skips_instead(self, rita):
        olga = make_user("olga", perms=("operate_run",))
        run = engine.open_run(store_spec(SCAN)[0], actor=rita).run
        refused = api(olga).post(f"/api/runs/{run.pk}/transition", {
            "step": "scan", "step_status": "completed"}, content_type="application/json")
        assert refused.status_code == 409
        skipped = api(olga).post(f"/api/runs/{run.pk}/steps/scan/skip", {"reason": "by hand"},
                                 content_type="application/json")
        assert skipped.status_code == 200
        assert Step.objects.get(run=run, key="scan").status == "skipped"

    def test_what_an_agent_reports_is_shown_as_its_own(self, rita, client):
        bob = make_user("bob", "qa")
        run = engine.open_run(store_spec(SCAN)[0], actor=rita).run
        work(run, "scan", summary="workflows.callables.noop returned")
        response = api(rita).post(f"/api/runs/{run.pk}/transition", {
            "step": "agent", "step_status": "completed", "summary": "Looks fine to me",
            "evidence": {"stdout": "reviewed 3 files"}}, content_type="application/json")
        assert response.status_code == 200
        client.force_login(bob)
        card = client.get("/").content.decode()
        assert "reported by <b>rita</b>, not run by a worker" in card
        assert "Looks fine to me" in card
        page = client.get(f"/runs/{run.pk}/").content.decode()
        assert "last reported by rita" in page


class TestWebInputMeetsTheAPIsLimits:
    @pytest.mark.parametrize("comment, problem", [
        ("x" * 5001, "at most 5000"),
        ("fine\x00", "NUL character"),
    ])
    def test_a_comment_past_the_limit_or_with_nul_is_refused(self, waiting, people, comment,
                                                             problem):
        client = Client(HTTP_HX_REQUEST="true")
        client.force_login(people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/", {"comment": comment})
        assert response.status_code == 400 and problem in response.content.decode()
        assert not waiting.steps.get(key="qa").approvals.exists()

    def test_a_skip_reason_is_capped(self, release_spec, people):
        run = engine.open_run(release_spec, actor=people["alice"]).run
        client = Client()
        client.force_login(people["alice"])
        client.post(f"/runs/{run.pk}/steps/build/skip/", {"comment": "r" * 501})
        assert Step.objects.get(run=run, key="build").status == "pending"
        with pytest.raises(engine.InvalidInput, match="at most 500"):
            engine.cancel_run(run, reason="r" * 501)

    def test_a_bulk_decision_with_a_huge_gate_id_is_no_500(self, waiting, people):
        client = Client()
        client.force_login(people["bob"])
        response = client.post("/inbox/decide/", {
            "decision": "approve", "gate": ["99999999999999999999999", str(2**63)]})
        assert response.status_code == 302

    def test_a_search_with_nul_is_no_500(self, people, client):
        client.force_login(people["bob"])
        assert client.get("/runs/", {"q": "a\x00b"}).status_code == 200


class TestWhoReadsARun:
    """One rule, on every entry point: TOLLGATE_RUN_VISIBILITY."""

    @pytest.fixture
    def involved(self, settings, release_spec, people):
        settings.TOLLGATE_RUN_VISIBILITY = "involved"
        run = engine.open_run(release_spec, actor=people["bob"], title="Bob's").run
        return run

    def readers(self, run, people, url):
        seen = {}
        for name, user in people.items():
            client = Client()
            client.force_login(user)
            seen[name] = client.get(url.format(run=run.pk)).status_code
        return seen

    @pytest.mark.parametrize("url", ["/runs/{run}/", "/runs/{run}/audit/?format=csv"])
    def test_pages_under_involved(self, involved, people, url):
        # bob requested it, carol is in qa (its gate's group), alice operates; erin and dave
        # have nothing to do with it.
        assert self.readers(involved, people, url) == {
            "alice": 200, "bob": 200, "carol": 200, "erin": 404, "dave": 404}

    def test_the_api_and_the_lists_under_involved(self, involved, people):
        for name, expected in {"bob": 200, "erin": 404}.items():
            client = api(people[name])
            for path in ("", "/timeline", "/resume", "/audit"):
                assert client.get(f"/api/runs/{involved.pk}{path}").status_code == expected
            listed = [r["id"] for r in client.get("/api/runs").json()["results"]]
            assert (involved.pk in listed) == (expected == 200)
        for name, listed in {"bob": True, "erin": False}.items():
            browser = Client()
            browser.force_login(people[name])
            page = browser.get("/runs/").content.decode()
            assert (f'href="/runs/{involved.pk}/"' in page) == listed

    def test_everyone_signed_in_reads_every_run_by_default(self, release_spec, people):
        run = engine.open_run(release_spec, actor=people["bob"]).run
        assert set(self.readers(run, people, "/runs/{run}/").values()) == {200}
