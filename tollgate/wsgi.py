import os
import re
from urllib.parse import unquote_plus

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tollgate.settings")
django_application = get_wsgi_application()

from workflows.reads import live  # noqa: E402  (after Django is set up)

_LIVE_PAGES = re.compile(r"/(runs/[0-9]+/)?$")  # the inbox and a run page poll
_WATCH = re.compile(r"(?:^|&)watch=([^&]*)")
_SEEN = re.compile(r"(?:^|&)seen=([^&]*)")


def application(environ, start_response):
    """Django, except for an open page's poll whose versions say nothing changed: that is
    answered here (204) without the session, the database or Django's middleware, so that
    hundreds of open pages polling each second cost almost nothing (workflows.reads.live)."""
    query, path = environ.get("QUERY_STRING", ""), environ.get("PATH_INFO", "")
    if (environ.get("REQUEST_METHOD") == "GET" and "watch=" in query
            and _LIVE_PAGES.match(path)):
        watch, seen = _WATCH.search(query), _SEEN.search(query)
        if watch and seen and live.unchanged(unquote_plus(watch[1]), unquote_plus(seen[1]),
                                             path):
            start_response("204 No Content", [("Cache-Control", "no-store"),
                                               ("Vary", "Cookie")])
            return []
    return django_application(environ, start_response)

