"""What the inbox's and the run page's pollers send and get back besides their rows: the
page's versions (workflows.reads.live)."""

from __future__ import annotations

from django.urls import reverse

from workflows.reads import live


def inbox_versions(request) -> dict:
    """What the viewer's inbox watches, as it stands now (read before the page's rows)."""
    return live.watch(request.user.pk, reverse("inbox"),
                      [*live.inbox_keys(request.user), *_session(request)])


def run_versions(request, run_id: int) -> dict:
    """What a run page watches, as it stands now (read before the page's rows)."""
    return live.watch(request.user.pk, reverse("run_detail", args=[run_id]),
                      [live.run_key(run_id), *_session(request)])


def _session(request) -> list[str]:
    """The session's own key: its pages' streams end with it."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    return [live.session_key(key)] if key else []


def unchanged(request) -> bool:
    """The viewer's own page's versions say nothing it watches has changed."""
    return live.unchanged(request.GET.get("watch", ""), request.GET.get("seen", ""),
                          request.path, user_id=request.user.pk)


def with_versions(response, watching: dict):
    """The page's new versions, which its poller sends next time (static/tollgate/page.js)."""
    response["Tollgate-Watch"], response["Tollgate-Seen"] = watching["watch"], watching["seen"]
    return response
