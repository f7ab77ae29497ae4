"""Pages, buttons, permissions and stale presses through the Django test client."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from goals.models import Goal
from workflows import engine
from workflows.models import Approval, Checkpoint, Run
from workflows.reads import selectors
from workflows.web import cards

pytestmark = pytest.mark.django_db


def button(name: str) -> str:
    """A button as the page writes it: its word, then the gate or step it acts on for
    screen readers."""
    return f'>{name}<span class="visually-hidden">'

HTMX = {"HTTP_HX_REQUEST": "true"}


def as_user(client, user):
    client.force_login(user)
    return client


class TestLogin:
    def test_pages_require_login(self, client, waiting):
        for url in ["/", "/runs/", f"/runs/{waiting.pk}/", "/goals/"]:
            response = client.get(url)
            assert response.status_code == 302 and response["Location"].startswith("/login/")

    def test_login_then_inbox(self, client, people):
        response = client.post("/login/", {"username": "bob", "password": "pw-bob"})
        assert response.status_code == 302 and response["Location"] == "/"

    def test_logout_is_a_post(self, client, people):
        as_user(client, people["bob"])
        assert client.post("/logout/").status_code == 302
        assert client.get("/").status_code == 302


class TestInbox:
    def test_lists_gates_of_my_groups_with_count(self, client, waiting, people):
        body = as_user(client, people["bob"]).get("/").content.decode()
        assert "QA sign-off" in body and 'id="inbox-count">1<' in body

    def test_outsider_and_requester_see_nothing(self, client, waiting, people):
        for name in ("erin", "alice", "dave"):
            client.force_login(people[name])
            assert "Nothing waits on you" in client.get("/").content.decode()

    def test_oldest_first(self, client, release_spec, people, waiting):
        newer = engine.open_run(release_spec, actor=people["alice"], title="Newer").run
        engine.start_step(newer, "build")
        engine.complete_step(newer, "build")
        body = as_user(client, people["bob"]).get("/").content.decode()
        assert body.index("Release 1.0") < body.index("Newer")

    def test_approve_from_inbox_with_htmx_swaps_the_card(self, client, waiting, people):
        as_user(client, people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/",
                               {"view": "inbox", "comment": "ok"}, **HTMX)
        body = response.content.decode()
        assert response.status_code == 200 and "You approved QA sign-off" in body
        assert 'hx-swap-oob="true">0<' in body and "<html" not in body


class TestRunPage:
    def test_shows_steps_timeline_and_buttons_for_approver(self, client, waiting, people):
        body = as_user(client, people["bob"]).get(f"/runs/{waiting.pk}/").content.decode()
        assert button("Approve") in body and button("Reject") in body
        assert button("Retry") not in body and "Cancel run" not in body
        assert "step completed" in body and 'hx-trigger="every 1s"' in body

    def test_operator_sees_cancel_not_approve(self, client, waiting, people):
        body = as_user(client, people["alice"]).get(f"/runs/{waiting.pk}/").content.decode()
        assert "Cancel run" in body and button("Approve") not in body

    def test_manager_sees_everything_and_no_buttons(self, client, waiting, people):
        body = as_user(client, people["dave"]).get(f"/runs/{waiting.pk}/").content.decode()
        assert "QA sign-off" in body
        for shown in (button("Approve"), button("Reject"), button("Retry"), "Cancel run"):
            assert shown not in body

    def test_retry_button_on_failed_step_for_operator(self, client, release_spec, people):
        run = engine.open_run(release_spec).run
        engine.start_step(run, "build")
        engine.fail_step(run, "build", retryable=False, summary="boom")
        body = as_user(client, people["alice"]).get(f"/runs/{run.pk}/").content.decode()
        assert button("Retry") in body and "boom" in body

    def test_output_is_escaped(self, client, release_spec, people):
        run = engine.open_run(release_spec).run
        engine.start_step(run, "build")
        engine.complete_step(run, "build", summary="<b>bold</b>",
                             evidence={"stdout": "<script>alert(1)</script>", "exit_code": 0})
        body = as_user(client, people["dave"]).get(f"/runs/{run.pk}/").content.decode()
        assert "<script>alert(1)</script>" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "&lt;b&gt;bold" in body

    def test_poll_without_change_is_204(self, client, waiting, people):
        as_user(client, people["dave"])
        waiting.refresh_from_db()
        url = f"/runs/{waiting.pk}/?seq={waiting.checkpoint_seq}"
        assert client.get(url, **HTMX).status_code == 204
        engine.approve(waiting, "qa", user=people["bob"])
        response = client.get(url, **HTMX)
        assert response.status_code == 200 and '<div id="run-body"' in response.content.decode()

    def test_a_poll_gets_only_what_changed_out_of_band(self, client, waiting, people):
        import re

        as_user(client, people["dave"])
        waiting.refresh_from_db()
        page = client.get(f"/runs/{waiting.pk}/").content.decode()
        have = re.findall(r'name="have" value="([^"]+)"', page)
        assert len(have) == waiting.steps.count()
        seen = waiting.checkpoint_seq
        engine.approve(waiting, "qa", user=people["bob"])
        response = client.get(f"/runs/{waiting.pk}/", {"seq": seen, "have": have}, **HTMX)
        body = response.content.decode()
        assert response.status_code == 200 and 'id="run-body"' not in body
        # The gate's row (decided), not the build's (unchanged), the head, the checkpoint.
        rows = re.findall(r'<tr id="step-([\w-]+)"[^>]*hx-swap-oob="true"', body)
        assert "qa" in rows and "build" not in rows
        assert 'id="run-head" hx-swap-oob="true"' in body
        assert f'id="cp-{seen + 1}"' in body and f'id="cp-{seen}"' not in body
        assert 'hx-swap-oob="beforeend:#timeline-list"' in body

    def test_closed_run_stops_polling(self, client, waiting, people):
        engine.cancel_run(waiting)
        body = as_user(client, people["dave"]).get(f"/runs/{waiting.pk}/").content.decode()
        assert "hx-trigger" not in body

    def test_unknown_run_is_404(self, client, people):
        assert as_user(client, people["dave"]).get("/runs/999/").status_code == 404


class TestButtons:
    def test_approve_without_htmx_redirects_back(self, client, waiting, people):
        as_user(client, people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/", {"next": "/"})
        assert response.status_code == 302 and response["Location"] == "/"
        assert Approval.objects.count() == 1

    def test_unsafe_next_is_ignored(self, client, waiting, people):
        as_user(client, people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/",
                               {"next": "https://evil.example/"})
        assert response["Location"] == f"/runs/{waiting.pk}/"

    def test_double_click_records_one_decision(self, client, waiting, people):
        as_user(client, people["bob"])
        url = f"/runs/{waiting.pk}/steps/qa/approve/"
        assert client.post(url, **HTMX).status_code == 200
        second = client.post(url, **HTMX)
        assert second.status_code == 409 and "already decided" in second.content.decode()
        assert Approval.objects.count() == 1

    def test_forbidden_press_is_403_with_message(self, client, waiting, people):
        as_user(client, people["erin"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/")
        assert response.status_code == 403
        assert "not in the &#x27;qa&#x27; group" in response.content.decode()
        assert not Approval.objects.exists()

    def test_requester_cannot_approve_own_run(self, client, release_spec, people):
        run = engine.open_run(release_spec, actor=people["bob"]).run
        engine.start_step(run, "build")
        engine.complete_step(run, "build")
        response = as_user(client, people["bob"]).post(f"/runs/{run.pk}/steps/qa/approve/")
        assert response.status_code == 403 and "cannot decide" in response.content.decode()

    def test_stale_press_is_409(self, client, waiting, people):
        engine.cancel_run(waiting)
        response = as_user(client, people["bob"]).post(f"/runs/{waiting.pk}/steps/qa/approve/",
                                                       **HTMX)
        assert response.status_code == 409 and "is cancelled" in response.content.decode()

    def test_reject_needs_comment(self, client, waiting, people):
        as_user(client, people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/reject/", {"comment": " "})
        assert response.status_code == 400
        assert "A comment is required to reject." in response.content.decode()
        response = client.post(f"/runs/{waiting.pk}/steps/qa/reject/", {"comment": "broken"})
        assert response.status_code == 302
        assert Run.objects.get(pk=waiting.pk).status == "failed"

    def test_retry_and_cancel_need_operator(self, client, waiting, people):
        as_user(client, people["bob"])
        assert client.post(f"/runs/{waiting.pk}/cancel/").status_code == 403
        assert client.get(f"/runs/{waiting.pk}/cancel/").status_code == 403
        assert client.post(f"/runs/{waiting.pk}/steps/build/retry/").status_code == 403
        assert Run.objects.get(pk=waiting.pk).status == "waiting_approval"

    def test_operator_cancels_after_confirming(self, client, waiting, people):
        as_user(client, people["alice"])
        confirm = client.get(f"/runs/{waiting.pk}/cancel/").content.decode()
        assert "Yes, cancel the run" in confirm
        response = client.post(f"/runs/{waiting.pk}/cancel/", {"reason": "wrong branch"})
        assert response.status_code == 302
        assert Run.objects.get(pk=waiting.pk).status == "cancelled"
        assert Checkpoint.objects.filter(run=waiting).last().actor == people["alice"]

    def test_operator_retries_failed_step(self, client, release_spec, people):
        run = engine.open_run(release_spec).run
        engine.start_step(run, "build")
        engine.fail_step(run, "build", retryable=False)
        response = as_user(client, people["alice"]).post(
            f"/runs/{run.pk}/steps/build/retry/", **HTMX)
        assert response.status_code == 200 and "Build: retry requested" in response.content.decode()
        assert run.steps.get(key="build").status == "pending"

    def test_csrf_is_enforced(self, waiting, people):
        from django.test import Client

        client = Client(enforce_csrf_checks=True)
        client.force_login(people["bob"])
        assert client.post(f"/runs/{waiting.pk}/steps/qa/approve/").status_code == 403
        assert not Approval.objects.exists()

    def test_get_on_action_is_refused(self, client, waiting, people):
        as_user(client, people["bob"])
        assert client.get(f"/runs/{waiting.pk}/steps/qa/approve/").status_code == 405


class TestRunList:
    def test_filters_and_pagination(self, client, release_spec, people, waiting):
        for i in range(30):
            engine.open_run(release_spec, title=f"Bulk {i}")
        as_user(client, people["bob"])
        page1 = client.get("/runs/").content.decode()
        assert "Page 1 · runs 1–25 and more" in page1
        assert "runs 26–31</span>" in client.get("/runs/?page=2").content.decode()
        assert "Page 1 · run 1</span>" in client.get(
            "/runs/?status=waiting_approval").content.decode()
        mine = client.get("/runs/?mine=1").content.decode()
        assert "Release 1.0" in mine and "Bulk" not in mine
        assert "No runs match" in client.get("/runs/?spec=nope").content.decode()


class TestGoals:
    def test_tree_lazy_children_and_detail(self, client, people, release_spec):
        root = Goal.objects.create(title="Company", owner=people["alice"])
        child = Goal.objects.create(title="Team", parent=root)
        engine.open_run(release_spec, goal=child)
        as_user(client, people["dave"])
        tree = client.get("/goals/").content.decode()
        assert "Company" in tree and "Team" not in tree and "1 open" in tree
        children = client.get(f"/goals/{root.pk}/children/?depth=1", **HTMX).content.decode()
        assert "Team" in children and "<html" not in children
        detail = client.get(f"/goals/{child.pk}/").content.decode()
        assert "Company" in detail and "Build, get QA sign-off" in detail

    def test_filter_by_status_and_owner(self, client, people):
        root = Goal.objects.create(title="Company")
        Goal.objects.create(title="Stuck thing", parent=root, status="blocked",
                            blocker_reason="legal", owner=people["bob"])
        as_user(client, people["dave"])
        body = client.get("/goals/?status=blocked").content.decode()
        assert "Stuck thing" in body and "legal" in body and "Company</a>" not in body
        body = client.get(f"/goals/?owner={people['bob'].pk}").content.decode()
        assert "Stuck thing" in body


def count_queries(client, url) -> int:
    from django.db import connection

    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


class TestQueryCounts:
    def test_goal_pages_are_constant_in_goal_count(self, client, people, release_spec):
        as_user(client, people["dave"])

        def grow(n):
            for i in range(n):
                root = Goal.objects.create(title=f"Root {i}", owner=people["alice"])
                for j in range(3):
                    child = Goal.objects.create(title=f"Child {i}.{j}", parent=root)
                    engine.open_run(release_spec, goal=child)
            return root

        root = grow(2)
        small = [count_queries(client, u) for u in
                 ("/goals/", f"/goals/{root.pk}/", f"/goals/{root.pk}/children/")]
        root = grow(40)
        big = [count_queries(client, u) for u in
               ("/goals/", f"/goals/{root.pk}/", f"/goals/{root.pk}/children/")]
        assert small == big

    def test_run_page_is_constant_in_checkpoint_count(self, client, release_spec, people):
        as_user(client, people["bob"])
        run = engine.open_run(waiting_spec(), actor=people["alice"]).run
        engine.record_transition(run, "agent", step_status="running")
        small = count_queries(client, f"/runs/{run.pk}/")
        for i in range(150):
            engine.record_transition(run, "agent", summary=f"progress {i}")
        big = count_queries(client, f"/runs/{run.pk}/")
        assert small == big
        assert Checkpoint.objects.filter(run=run).count() == 152

    def test_long_timeline_shows_latest_and_offers_all(self, client, release_spec, people,
                                                       settings, monkeypatch):
        monkeypatch.setattr("workflows.web.views.runs.TIMELINE_LATEST", 10)
        as_user(client, people["bob"])
        run = engine.open_run(waiting_spec()).run
        engine.record_transition(run, "agent", step_status="running")
        for i in range(30):
            engine.record_transition(run, "agent", summary=f"progress {i}")
        body = client.get(f"/runs/{run.pk}/").content.decode()
        assert "progress 29" in body and "progress 5<" not in body and "Show all 32" in body
        body = client.get(f"/runs/{run.pk}/?timeline=all").content.decode()
        assert "progress 5<" in body and "Show all" not in body

    def test_load_older_pages_back_through_the_timeline(self, client, people, monkeypatch):
        monkeypatch.setattr("workflows.web.views.runs.TIMELINE_LATEST", 10)
        as_user(client, people["bob"])
        run = engine.open_run(waiting_spec()).run
        engine.record_transition(run, "agent", step_status="running")
        for i in range(30):
            engine.record_transition(run, "agent", summary=f"progress {i}", label=f"p{i}")
        body = client.get(f"/runs/{run.pk}/").content.decode()
        assert "?before=23" in body and "Load 22 older checkpoints" in body
        assert '<mark class="label">p29</mark>' in body
        older = client.get(f"/runs/{run.pk}/?before=23", HTTP_HX_REQUEST="true")
        text = older.content.decode()
        assert "<html" not in text and 'id="cp-22"' in text and 'id="cp-13"' in text
        assert 'id="cp-23"' not in text and 'id="cp-12"' not in text
        assert "?before=13" in text and "Load 12 older" in text
        first = client.get(f"/runs/{run.pk}/?before=3", HTTP_HX_REQUEST="true").content.decode()
        assert 'id="cp-1"' in first and "older" not in first.split('id="cp-1"')[0]

    def test_pinned_counts(self, client, waiting, people, django_assert_num_queries):
        as_user(client, people["bob"])
        # session, user, run, steps, approvals, checkpoints, the waiting gates' facts (their
        # rules, who decided, the user's groups and whom they decide for: one statement),
        # two permission lookups (user and group permissions) and the inbox count
        with django_assert_num_queries(10):
            client.get(f"/runs/{waiting.pk}/")
        # session, user, whom the user decides for, gates, the evidence (dependency steps,
        # decisions, rules), the brief (every step of the gates' runs), the filters'
        # choices, who else may decide and who was told, the inbox count, and the two
        # permission lookups of the nav, the groups and delegations its versions watch, and
        # the person's own away period
        with django_assert_num_queries(16):
            client.get("/")

    def test_run_list_is_constant(self, client, release_spec, people):
        as_user(client, people["bob"])
        engine.open_run(release_spec)
        small = count_queries(client, "/runs/")
        for _ in range(20):
            engine.open_run(release_spec)
        assert count_queries(client, "/runs/") == small

    def test_a_search_pages_without_counting_its_matches(self, client, release_spec, people):
        as_user(client, people["bob"])
        for _ in range(27):
            engine.open_run(release_spec)
        body = client.get("/runs/").content.decode()
        assert "Page 1 · runs 1–25 and more" in body and "Older" in body
        body = client.get("/runs/?page=2").content.decode()
        assert "Page 2 · runs 26–27</span>" in body and "Newer" in body and "Older" not in body
        # Past the end, or not a page number: the last page, or the first.
        assert "Page 2 · runs 26–27</span>" in client.get("/runs/?page=9").content.decode()
        assert "Page 1 · runs 1–25" in client.get("/runs/?page=x").content.decode()
        assert "No runs match." in client.get("/runs/?q=nothing-like-it").content.decode()


class TestProfileTokens:
    def test_create_shows_once_and_revoke(self, client, people):
        from workflows.models import ApiToken

        as_user(client, people["bob"])
        body = client.post("/profile/", {"name": "laptop"}).content.decode()
        token = ApiToken.objects.get(user=people["bob"])
        assert "tg_" in body and token.name == "laptop"
        assert "tg_" not in client.get("/profile/").content.decode().replace(token.prefix, "")
        client.post(f"/profile/tokens/{token.pk}/revoke/")
        token.refresh_from_db()
        assert token.revoked_at is not None

    def test_cannot_revoke_someone_elses_token(self, client, people):
        from workflows.models import ApiToken

        token, _ = ApiToken.objects.issue(people["alice"])
        as_user(client, people["bob"])
        assert client.post(f"/profile/tokens/{token.pk}/revoke/").status_code == 404
        token.refresh_from_db()
        assert token.revoked_at is None


class TestSkip:
    def test_operator_sees_skip_on_work_steps_never_on_gates(self, client, waiting, people):
        body = as_user(client, people["alice"]).get(f"/runs/{waiting.pk}/").content.decode()
        deploy = body.split('id="step-deploy"')[1].split("</tr>")[0]
        qa = body.split('id="step-qa"')[1].split("</tr>")[0]
        assert button("Skip") in deploy and button("Skip") not in qa
        assert button("Skip") not in as_user(client, people["bob"]).get(
            f"/runs/{waiting.pk}/").content.decode()

    def test_skip_needs_a_reason_and_then_moves_the_run_on(self, client, release_spec, people):
        run = engine.open_run(release_spec, actor=people["alice"]).run
        as_user(client, people["alice"])
        url = f"/runs/{run.pk}/steps/build/skip/"
        refused = client.post(url, {"comment": " "}, **HTMX)
        assert refused.status_code == 400 and "A reason is required" in refused.content.decode()
        assert run.steps.get(key="build").status == "pending"
        done = client.post(url, {"comment": "built elsewhere"}, **HTMX)
        assert done.status_code == 200 and "Build skipped." in done.content.decode()
        assert run.steps.get(key="build").status == "skipped"
        assert run.steps.get(key="qa").status == "waiting_approval"
        assert Checkpoint.objects.filter(run=run, kind="step_skipped",
                                         summary="built elsewhere").exists()


class TestSearch:
    @pytest.fixture
    def runs(self, release_spec, people):
        nightly = engine.open_run(release_spec, actor=people["alice"], title="Nightly 42",
                                  idempotency_key="nightly-42").run
        hotfix = engine.open_run(release_spec, actor=people["bob"], title="Hotfix").run
        engine.cancel_run(hotfix)
        return nightly, hotfix

    def test_free_text_requester_and_dates(self, client, runs, people):
        nightly, hotfix = runs
        as_user(client, people["dave"])

        def found(query):
            body = client.get(f"/runs/?{query}").content.decode()
            return {run.title for run in runs if f"#{run.pk} {run.title}" in body}

        assert found("q=nightly") == {"Nightly 42"}
        assert found("q=NIGHTLY-42") == {"Nightly 42"}  # the idempotency key
        assert found("q=bob") == {"Hotfix"}  # the requester
        assert found("requester=alice") == {"Nightly 42"}
        today = nightly.created_at.date().isoformat()
        assert found(f"opened_from={today}&opened_to={today}") == {"Nightly 42", "Hotfix"}
        assert found(f"finished_from={today}") == {"Hotfix"}
        assert found("opened_from=2001-01-01&opened_to=2001-01-02") == set()
        assert found("opened_from=not-a-date") == {"Nightly 42", "Hotfix"}  # ignored

    def test_the_text_search_follows_every_change_of_a_run(self, runs):
        """The words searched for are the run's as they are now: a new title is found and
        the old one is not, and text with LIKE's wildcards in it is matched as text (on
        SQLite, three characters or more through its trigram table, with its plan)."""
        from workflows.models import Run

        def found(q):
            return {r.title for r in selectors.runs(q=q)}

        hotfix = runs[1]
        Run.objects.filter(pk=hotfix.pk).update(title="Weekly 50% rollout")
        assert found("hotfix") == set() and found("weekly") == {"Weekly 50% rollout"}
        assert found("50%") == {"Weekly 50% rollout"} and found("5_%") == set()
        assert found("ly 5") == {"Weekly 50% rollout"}
        assert found("ly") == {"Weekly 50% rollout", "Nightly 42"}  # too short: a scan
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN QUERY PLAN " + selectors.FTS_MATCHES, ["%weekly%", 1])
                assert "run_search VIRTUAL TABLE INDEX" in str(cursor.fetchall())

    def test_a_word_many_runs_have_is_read_in_order_and_a_rare_one_looked_up(
            self, runs, release_spec, monkeypatch):
        """Past FEW_MATCHES, a word is found by reading the runs newest first (so a word
        every run has costs one page); a rare one comes from the trigram table. Either way
        the same runs, newest first."""
        monkeypatch.setattr(selectors, "FEW_MATCHES", 3)
        made = [engine.open_run(release_spec, title=f"Common {i}").run for i in range(5)]
        newest_first = [r.title for r in reversed(made)]
        assert [r.title for r in selectors.runs(q="common")] == newest_first
        assert [r.title for r in selectors.runs(q="common 3")] == ["Common 3"]

    def test_days_are_the_viewers_days(self, runs):
        from datetime import UTC, date, datetime
        from zoneinfo import ZoneInfo

        from django.utils import timezone

        from workflows.models import Run

        nightly = runs[0]
        Run.objects.filter(pk=nightly.pk).update(created_at=datetime(2026, 3, 1, 23, 30,
                                                                     tzinfo=UTC))

        def opened_on(day):
            return list(selectors.runs(opened_from=day, opened_to=day).filter(pk=nightly.pk))

        with timezone.override(UTC):
            assert opened_on(date(2026, 3, 1)) == [nightly]
            assert opened_on(date(2026, 3, 2)) == []
        with timezone.override(ZoneInfo("Asia/Tokyo")):  # 08:30 on the 2nd there
            assert opened_on(date(2026, 3, 1)) == []
            assert opened_on(date(2026, 3, 2)) == [nightly]

    def test_api_search(self, runs, people):
        from django.test import Client

        from workflows.models import ApiToken

        token = ApiToken.objects.issue(people["dave"])[1]
        api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        body = api.get("/api/runs", {"q": "hotfix"}).json()
        assert body["count"] == 1 and body["results"][0]["title"] == "Hotfix"
        assert api.get("/api/runs", {"opened_from": "nope"}).status_code == 400

    def test_search_takes_the_same_queries_whatever_the_data(self, client, runs, people,
                                                             release_spec):
        as_user(client, people["dave"])
        url = "/runs/?q=e&requester=alice"
        with CaptureQueriesContext(connection) as small:
            client.get(url)
        for i in range(30):
            engine.open_run(release_spec, actor=people["alice"], title=f"More {i}")
        with CaptureQueriesContext(connection) as large:
            client.get(url)
        assert len(small) == len(large)


class TestAuditExport:
    def test_a_run_downloads_as_json_and_csv(self, client, waiting, people):
        engine.approve(waiting, "qa", user=people["bob"], comment="=SUM(A1)")
        as_user(client, people["dave"])
        data = client.get(f"/runs/{waiting.pk}/audit/").json()
        assert [c["kind"] for c in data["timeline"]][:3] == [
            "run_opened", "step_started", "step_completed"]
        assert data["decisions"][0]["user"] == "bob"
        body = b"".join(client.get(f"/runs/{waiting.pk}/audit/?format=csv")
                        .streaming_content).decode()
        assert "decision" in body and "'=SUM(A1)" in body and "step_completed" in body

    def test_audit_page_is_for_staff_and_managers(self, client, waiting, people):
        from django.contrib.auth.models import Permission

        engine.approve(waiting, "qa", user=people["bob"], comment="fine")
        as_user(client, people["bob"])
        assert client.get("/audit/").status_code == 403
        people["dave"].user_permissions.add(Permission.objects.get(codename="export_audit"))
        as_user(client, people["dave"])
        assert "1 decision in this range" in client.get("/audit/").content.decode()
        response = client.get("/audit/?format=csv&from=2000-01-01")
        lines = b"".join(response.streaming_content).decode().splitlines()
        assert lines[0].startswith("at,run,run_title,step") and len(lines) == 2
        assert ",bob,approve,qa,fine," in lines[1]

    def test_the_export_streams_in_constant_queries(self, client, waiting, people):
        from workflows.models import Approval

        as_user(client, make_admin())
        step = waiting.steps.get(key="qa")
        Approval.objects.bulk_create(Approval(step=step, attempt=i + 10, user=people["bob"],
                                              decision="approve") for i in range(3000))
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/audit/?format=csv")
            lines = sum(1 for _ in response.streaming_content)
        assert lines == 3001 and len(queries) < 12


def make_admin():
    from ..conftest import make_user

    return make_user("auditor", is_staff=True)


def test_no_debug_handler_can_wipe_the_page_on_a_4xx(client, people, settings):
    """With DEBUG on, django-htmx's error handler would replace the page with a bare 403/400
    fragment; the page loads htmx without it, so a refusal renders inside the page."""
    settings.DEBUG = True
    client.force_login(people["bob"])
    body = client.get("/").content.decode()
    assert "htmx-2.min.js" in body and "django-htmx.js" not in body


class TestEvidenceOnTheCard:
    @pytest.fixture
    def gated(self, people):
        from workflows.specs.storage import store_spec

        spec = store_spec({"name": "ship", "params": [{"name": "version"}], "steps": [
            {"key": "build", "title": "Build", "run": {"command": ["true"]}},
            {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
             "description": "Check {{ params.version }} on {{ state.env }}; see "
                            "https://ci.example/{{ params.version }} <b>now</b>",
             "approval": {"group": "qa", "required": 2, "timeout_seconds": 3600}}]})[0]
        run = engine.open_run(spec, actor=people["alice"], title="Ship 3.0",
                              params={"version": "3.0"}, shared_state={"env": "staging"}).run
        engine.start_step(run, "build")
        output = "".join(f"line {i}\n" for i in range(1, 9))
        engine.complete_step(run, "build", summary="built", state_patch={"artifact": "a.tgz"},
                             evidence={"stdout": output, "exit_code": 0})
        return run

    def test_the_card_shows_what_the_approver_decides_with(self, client, gated, people):
        engine.approve(gated, "qa", user=people["bob"])
        client.force_login(people["carol"])
        body = client.get("/").content.decode()
        assert "Check 3.0 on staging; see" in body
        assert 'href="https://ci.example/3.0"' in body and "&lt;b&gt;now&lt;/b&gt;" in body
        assert "<b>1 of 2</b> approvals · <bdi>bob</bdi> approved" in body
        assert "decide by" in body and "“<bdi>Ship 3.0</bdi>”" in body and "alice" in body
        assert "line 8" in body and "Whole output" in body
        assert "<dt>artifact</dt><dd><bdi>a.tgz</bdi>" in body
        tail = body.split('<pre class="tail">')[1].split("</pre>")[0]
        assert tail.splitlines() == ["line 4", "line 5", "line 6", "line 7", "line 8"]

    def test_a_value_filled_into_the_instructions_is_text_never_a_link(self, client, people):
        from workflows.specs.storage import store_spec

        store_spec({"name": "ask", "params": [{"name": "note"}], "steps": [
            {"key": "qa", "title": "QA", "approval": {"group": "qa"},
             "description": "Read **{{ params.note }}** and the [guide](https://docs.example)"}]})
        run = engine.open_run("ask", actor=people["alice"], params={
            "note": "[log in](https://evil.example/login) https://evil.example *x* <b>y</b>"}).run
        client.force_login(people["carol"])
        for body in (client.get("/").content.decode(),
                     client.get(f"/runs/{run.pk}/").content.decode()):
            assert 'href="https://docs.example"' in body  # the author's link stays a link
            assert "evil.example" in body and 'href="https://evil.example' not in body
            assert "[log in](https://evil.example/login)" in body and "<b>y</b>" not in body

    def test_the_run_page_gate_row_shows_instructions_and_quorum(self, client, gated, people):
        client.force_login(people["dave"])
        body = client.get(f"/runs/{gated.pk}/").content.decode()
        assert "gate: 0 of 2 from qa" in body and "Check 3.0 on staging" in body

    def test_the_inbox_takes_the_same_queries_for_more_gates(self, client, gated, people,
                                                             release_spec):
        client.force_login(people["carol"])
        with CaptureQueriesContext(connection) as few:
            client.get("/")
        for _ in range(5):
            run = engine.open_run(release_spec, actor=people["alice"]).run
            engine.start_step(run, "build")
            engine.complete_step(run, "build")
        with CaptureQueriesContext(connection) as more:
            client.get("/")
        assert len(few) == len(more)


class TestLiveInbox:
    def test_a_poll_with_nothing_new_is_204_and_changes_come_as_swaps_around_the_cards(
            self, client, waiting, people, release_spec):
        as_user(client, people["carol"])
        page = client.get("/").content.decode()
        gate = waiting.steps.get(key="qa")
        have = page.split('name="have" value="')[1].split('"')[0]
        assert have == f"{gate.pk}:1.0"
        assert client.get("/", {"poll": 1, "have": have}, **HTMX).status_code == 204
        engine.approve(waiting, "qa", user=people["bob"])  # bob decides elsewhere: 1 of 2
        body = client.get("/", {"poll": 1, "have": have}, **HTMX).content.decode()
        # Only the quorum line is swapped: the card, and what carol types in it, stay.
        assert f'id="quorum-{gate.pk}" hx-swap-oob="true"' in body
        assert "<bdi>bob</bdi> approved" in body
        assert 'name="comment"' not in body and "<html" not in body
        assert 'id="inbox-count" hx-swap-oob="true">1<' in body
        other = engine.open_run(release_spec, actor=people["alice"]).run
        engine.start_step(other, "build")
        engine.complete_step(other, "build")
        body = client.get("/", {"poll": 1, "have": f"{gate.pk}:1.1"}, **HTMX).content.decode()
        new = other.steps.get(key="qa").pk
        assert 'hx-swap-oob="beforeend:#gate-list"' in body and f'id="gate-{new}"' in body
        assert 'id="bulk-bar" hx-swap-oob="true"' in body and "Approve selected" in body
        engine.cancel_run(waiting, actor="test")
        body = client.get("/", {"poll": 1, "have": [f"{gate.pk}:1.1", f"{new}:1.0"]},
                          **HTMX).content.decode()
        assert f'id="gate-{gate.pk}" hx-swap-oob="true"' in body
        assert "No longer waits on you: bob approved; run cancelled." in body
        assert "Approve selected" not in body  # one gate left: no bulk bar

    def test_a_quiet_poll_builds_no_card_whatever_the_backlog(self, client, waiting, people,
                                                               release_spec):
        as_user(client, people["carol"])

        def quiet_poll() -> int:
            have = [f"{pk}:{version}" for pk, version in
                    cards.inbox_versions(people["carol"]).items()]
            with CaptureQueriesContext(connection) as queries:
                assert client.get("/", {"poll": 1, "have": have}, **HTMX).status_code == 204
            return len(queries)

        few = quiet_poll()
        for _ in range(5):
            run = engine.open_run(release_spec, actor=people["alice"]).run
            engine.start_step(run, "build")
            engine.complete_step(run, "build")
        # session, user, what the page watches, the versions: no evidence read (a poll
        # with the page's own versions reads nothing: tests/web/test_live.py)
        assert quiet_poll() == few <= 5

    def test_the_inbox_shows_the_oldest_gates_up_to_its_limit(self, client, waiting, people,
                                                             release_spec, monkeypatch):
        monkeypatch.setattr(cards, "INBOX_LIMIT", 2)
        for _ in range(2):
            run = engine.open_run(release_spec, actor=people["alice"]).run
            engine.start_step(run, "build")
            engine.complete_step(run, "build")
        as_user(client, people["carol"])
        body = client.get("/").content.decode()
        assert body.count('class="card gate"') == 2
        assert "Showing the first 2 gates of this view (3 wait on you in all)" in body
        assert f'id="gate-{waiting.steps.get(key="qa").pk}"' in body  # the oldest is shown

    def test_a_poll_cannot_probe_gates_of_other_groups(self, client, waiting, people):
        as_user(client, people["erin"])  # in no group
        gate = waiting.steps.get(key="qa")
        response = client.get("/", {"poll": 1, "have": f"{gate.pk}:1.0"}, **HTMX)
        assert response.status_code == 204

    def test_the_header_count_follows_a_decision_on_the_run_page(self, client, waiting,
                                                                 people):
        as_user(client, people["bob"])
        response = client.post(f"/runs/{waiting.pk}/steps/qa/approve/", **HTMX)
        assert 'id="inbox-count" hx-swap-oob="true">0<' in response.content.decode()

    def test_my_decisions_lists_what_i_decided(self, client, waiting, people):
        engine.approve(waiting, "qa", user=people["bob"], comment="smoke tests pass")
        as_user(client, people["bob"])
        body = client.get("/decisions/").content.decode()
        assert "QA sign-off" in body and "approved" in body and "smoke tests pass" in body
        as_user(client, people["carol"])
        assert "smoke tests pass" not in client.get("/decisions/").content.decode()


class TestBulkDecisions:
    @pytest.fixture
    def three(self, release_spec, people):
        runs = []
        for i in range(3):
            run = engine.open_run(release_spec, actor=people["alice"], title=f"R{i}").run
            engine.start_step(run, "build")
            engine.complete_step(run, "build")
            runs.append(run)
        return runs

    def gate_ids(self, runs):
        return [str(run.steps.get(key="qa").pk) for run in runs]

    def test_approve_several_with_one_comment_each_on_its_own(self, client, three, people):
        as_user(client, people["bob"])
        engine.approve(three[2], "qa", user=people["bob"])  # decided already, elsewhere
        response = client.post("/inbox/decide/", {
            "decision": "approve", "comment": "batch ok", "gate": self.gate_ids(three)},
            **HTMX)
        body = response.content.decode()
        assert response.status_code == 200 and body.count("You approved QA sign-off") == 2
        assert "bob has already decided qa" in body
        assert Approval.objects.filter(comment="batch ok").count() == 2
        for run in three[:2]:
            assert Checkpoint.objects.filter(run=run, kind="approval_recorded").count() == 1

    def test_reject_needs_the_comment_and_says_so_in_each_card(self, client, three, people):
        as_user(client, people["bob"])
        body = client.post("/inbox/decide/", {"decision": "reject", "gate": self.gate_ids(
            three)}, **HTMX).content.decode()
        assert body.count("A comment is required to reject.") == 3
        assert not Approval.objects.exists()

    def test_without_javascript_it_redirects_with_messages(self, client, three, people):
        as_user(client, people["carol"])
        response = client.post("/inbox/decide/", {
            "decision": "reject", "comment": "not this week", "gate": self.gate_ids(three)},
            follow=True)
        body = response.content.decode()
        assert body.count("You rejected QA sign-off") == 3
        assert {r.status for r in Run.objects.all()} == {"failed"}


def waiting_spec():
    """A spec whose one step waits for an agent's reports."""
    from workflows.specs.storage import store_spec

    return store_spec({"name": "agent-only", "steps": [{"key": "agent"}]})[0]


class TestTheCardHoldsTheDecision:
    SPEC = {"name": "deploy-card", "params": [
        {"name": "version", "type": "string"}, {"name": "rollout", "type": "choice",
                                                 "options": ["full", "canary"]},
        {"name": "dry_run", "type": "boolean", "default": False}],
        "steps": [
            {"key": "build", "title": "Build", "run": {"callable": "workflows.callables.noop"},
             "compensation": {"callable": "workflows.callables.noop"}},
            {"key": "review", "title": "Review", "depends_on": ["build"]},
            {"key": "qa", "title": "QA sign-off", "depends_on": ["review"],
             "description": "Check **{{ params.version }}** on [staging](https://staging.example)"
                            " <script>alert(1)</script> [bad](javascript:alert(1))",
             "approval": {"group": "qa"}},
            {"key": "deploy", "title": "Deploy", "depends_on": ["qa"],
             "run": {"callable": "workflows.callables.noop"}},
            {"key": "canary", "title": "Canary check", "depends_on": ["qa"],
             "when": {"params": "rollout", "equals": "canary"},
             "run": {"callable": "workflows.callables.noop"}}]}

    def test_params_trail_values_and_consequences(self, client, people):
        from tests.workflows.helpers import work
        from workflows.specs.storage import store_spec

        store_spec(self.SPEC)
        run = engine.open_run("deploy-card", actor=people["alice"],
                              params={"version": "2.2.0", "rollout": "full"}).run
        work(run, "build", summary="workflows.callables.noop returned")
        engine.record_transition(run, "review", actor=people["alice"], step_status="completed",
                                 state_patch={"verdict": "ok", "score": 0.97,
                                              "notes": "x" * 200})
        as_user(client, people["bob"])
        body = client.get("/").content.decode()
        assert "<dt>Version</dt><dd><bdi>2.2.0</bdi>" in body
        assert "<dt>Rollout</dt><dd><bdi>full</bdi>" in body
        assert "<dt>Dry run</dt><dd><bdi>no</bdi>" in body  # words for booleans
        # The whole trail (build is two steps back), with the values written, shortened.
        assert "<b>Build</b>" in body and "<b>Review</b>" in body
        assert "<dt>verdict</dt><dd><bdi>ok</bdi>" in body and "<dd><bdi>0.97</bdi>" in body
        assert "x" * 79 + "…" in body and "<summary>all</summary>" in body
        assert "workflows.callables.noop returned" not in body
        assert ("starts: Deploy, Canary check (if params rollout equals &quot;canary&quot;)"
                in body)
        assert "fails the run and runs the compensations of Build" in body
        # Instructions in Markdown, sanitised: no script, no javascript: link, safe rel.
        assert "<strong>2.2.0</strong>" in body
        assert ('<a href="https://staging.example" rel="noopener noreferrer nofollow">staging'
                in body)
        assert "<script>alert" not in body, body[body.find("<script>alert") - 300:][:400]
        assert 'href="javascript' not in body


class TestDeadlinesPeopleCanRead:
    SPEC = {"name": "timed", "steps": [
        {"key": "build", "run": {"callable": "workflows.callables.noop"}},
        {"key": "qa", "title": "QA sign-off", "depends_on": ["build"],
         "approval": {"group": "qa", "timeout_seconds": 3 * 3600 + 60}},
        {"key": "cab", "title": "Change board", "depends_on": ["build"],
         "approval": {"group": "qa", "timeout_seconds": 40 * 60 + 30, "on_timeout": "escalate",
                      "escalate_to": "release-managers"}}]}

    @pytest.fixture
    def timed(self, people):
        from tests.workflows.helpers import work
        from workflows.specs.storage import store_spec

        store_spec(self.SPEC)
        run = engine.open_run("timed", actor=people["alice"]).run
        work(run, "build")
        return run

    def test_the_card_says_when_in_my_time_zone_and_what_happens_then(self, client, timed,
                                                                      people):
        as_user(client, people["bob"])
        response = client.post("/profile/", {"time_zone": "Asia/Tokyo"})
        assert response.status_code == 302
        body = client.get("/").content.decode()
        assert "rejects itself in 3 h" in body
        assert "escalates to release-managers in 40 min" in body
        assert " JST</time>" in body  # the viewer's zone, named
        client.post("/profile/", {"time_zone": ""})
        assert " UTC</time>" in client.get("/").content.decode()
        bad = client.post("/profile/", {"time_zone": "Mars/Olympus"}, follow=True)
        assert "Unknown time zone" in bad.content.decode()

    def test_the_zone_follows_the_person_to_a_new_session(self, client, timed, people):
        from workflows.models import Preference

        Preference.objects.create(user=people["bob"], time_zone="Europe/Paris")
        client.post("/login/", {"username": "bob", "password": "pw-bob"})
        assert " CET</time>" in client.get("/").content.decode()

    def test_an_escalated_gate_has_a_badge_and_managers_see_deadlines(self, client, timed,
                                                                      people):
        from datetime import timedelta

        from django.contrib.auth.models import Permission

        from workflows.models import Step

        cab = Step.objects.get(run=timed, key="cab")
        Step.objects.filter(pk=cab.pk).update(deadline_at=cab.deadline_at - timedelta(hours=1))
        assert engine.expire_gate(cab.pk).kind == "gate_escalated"
        qa = Step.objects.get(run=timed, key="qa")
        Step.objects.filter(pk=qa.pk).update(deadline_at=qa.deadline_at - timedelta(hours=4))
        as_user(client, people["dave"])  # a manager
        assert client.get("/gates/due/").status_code == 403
        people["dave"].user_permissions.add(
            Permission.objects.get(codename="export_audit"))
        body = client.get("/gates/due/").content.decode()
        assert "<h2>qa <small>1 overdue" in body and "overdue by" in body
        assert "<h2>release-managers <small>0 overdue · 0 due soon · 1 escalated" in body
        assert "escalated from qa" in body
        body = client.get(f"/runs/{timed.pk}/").content.decode()
        assert "escalated from qa" in body and "overdue by" in body

    def test_favicon_and_api_docs_link(self, client, people):
        assert client.get("/favicon.ico").status_code == 301
        as_user(client, people["bob"])
        assert 'href="/api/docs"' in client.get("/profile/").content.decode()


class TestTheSmallerThings:
    def test_a_closed_run_offers_no_cancel_and_the_dialog_asks_why(self, client, waiting,
                                                                   people):
        as_user(client, people["alice"])
        page = client.get(f"/runs/{waiting.pk}/cancel/").content.decode()
        assert 'name="reason"' in page and "Yes, cancel the run" in page
        assert "hx-confirm" not in client.get(f"/runs/{waiting.pk}/").content.decode()
        engine.cancel_run(waiting, actor=people["alice"], reason="dropped")
        page = client.get(f"/runs/{waiting.pk}/cancel/").content.decode()
        assert "nothing left to cancel" in page and "Yes, cancel" not in page
        assert "Cancel run…" not in client.get(f"/runs/{waiting.pk}/").content.decode()

    def test_no_start_form_for_someone_who_cannot_start(self, client, release_spec, people):
        as_user(client, people["dave"])  # a manager: reads, starts nothing
        assert client.get("/specs/release/start/").status_code == 403
        assert "Start run" not in client.get("/specs/").content.decode()

    def test_a_bad_date_in_the_search_is_said(self, client, people):
        as_user(client, people["bob"])
        body = client.get("/runs/", {"opened_from": "2026-13-45"}).content.decode()
        assert "Not a date (YYYY-MM-DD), so not used: opened from &#x27;2026-13-45&#x27;" in body

    def test_the_audit_csv_holds_form_values_as_json(self, client, people):
        from tollgate.exports import safe_cell

        assert safe_cell({"rollout": "canary", "ok": True}) == '{"ok": true, "rollout": "canary"}'
        assert safe_cell("=1+1") == "'=1+1"

    def test_names_comments_and_values_are_isolated_and_booleans_are_words(self, client,
                                                                           waiting, people):
        spoof = "\u202eevil"
        engine.approve(waiting, "qa", user=people["bob"], comment=f"ok {spoof}")
        as_user(client, people["carol"])
        body = client.get(f"/runs/{waiting.pk}/").content.decode()
        assert f"“<bdi class=\"comment\">ok {spoof}</bdi>”" in body and "<bdi>bob</bdi>" in body
        from workflows.templatetags.tollgate import human

        assert (human(True), human(False), human({"a": 1})) == ("yes", "no", '{"a": 1}')

    def test_the_chart_and_the_table_round_a_latency_alike(self):
        from django.template.loader import render_to_string

        chart = render_to_string("goals/_bars.html", {
            "bars": [{"label": "qa", "value": 237.3, "width": 100}], "durations": True})
        assert "3 min" in chart and "237.3" not in chart


class TestSmallRefusals:
    def test_cancelling_from_the_page_needs_a_reason(self, client, waiting, people):
        client.force_login(people["alice"])
        response = client.post(f"/runs/{waiting.pk}/cancel/", {"reason": "  "})
        assert response.status_code == 400
        assert "Say why the run is cancelled" in response.content.decode()
        waiting.refresh_from_db()
        assert waiting.status == "waiting_approval"

    def test_a_token_needs_a_name(self, client, people):
        from workflows.models import ApiToken

        client.force_login(people["bob"])
        response = client.post("/profile/", {"name": " "}, follow=True)
        assert "Name the token" in response.content.decode()
        assert not ApiToken.objects.exists()

    def test_staff_without_admin_rights_see_no_admin_link_and_a_styled_refusal(
            self, client, people, waiting):
        from tests.conftest import make_user

        clerk = make_user("clerk", is_staff=True)
        client.force_login(clerk)
        assert 'href="/admin/"' not in client.get("/").content.decode()
        refused = client.get(f"/runs/{waiting.pk}/cancel/")  # for operators: said, styled
        assert refused.status_code == 403
        body = refused.content.decode()
        assert "Cancelling needs the operator permission." in body and 'class="bar"' in body
        people["alice"].is_staff = True
        people["alice"].save()
        client.force_login(people["alice"])
        assert 'href="/admin/"' in client.get("/").content.decode()
