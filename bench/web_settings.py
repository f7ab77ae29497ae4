"""Tollgate's settings with one page more, for the HTTP section: the least an approve must do
(bench.web_urls)."""

from tollgate.settings import *  # noqa: F403

ROOT_URLCONF = "bench.web_urls"
