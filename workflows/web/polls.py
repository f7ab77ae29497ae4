"""What the inbox's and the run page's pollers send and get back besides their rows: the
page's versions (workflows.live)."""

from __future__ import annotations

from workflows import live


def unchanged(request) -> bool:
    """The viewer's own page's versions say nothing it watches has changed."""
    token, seen = request.GET.get("watch", ""), request.GET.get("seen", "")
    found = live.watched(token) if token else None
    return found is not None and found[0] == request.user.pk and live.unchanged(token, seen)


def with_versions(response, watching: dict):
    """The page's new versions, which its poller sends next time (static/tollgate/page.js)."""
    response["Tollgate-Watch"], response["Tollgate-Seen"] = watching["watch"], watching["seen"]
    return response
