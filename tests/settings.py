"""Test settings: the real settings, with a file-backed test database and no auto-dispatch."""

import os

os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("TOLLGATE_SECURE_COOKIES", "0")
os.environ.setdefault("TOLLGATE_SSL_REDIRECT", "0")
os.environ.setdefault("TOLLGATE_BASE_URL", "http://testserver")
# Metrics files of this test session alone (its consumers inherit it and add theirs).
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var",
    f"metrics-test-{os.getpid()}"))

# Each test session (an xdist worker is one) keeps its own spool and seal key, named by its
# pid as its database and queue are, so that neighbours running at once never share a folder
# or a key; its consumers inherit them through the environment.
os.environ.setdefault("TOLLGATE_SPOOL_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var",
    f"spool-test-{os.getpid()}"))
# The suite's consumers run commands as the suite's own account, knowingly (the command-user
# tests set TOLLGATE_COMMAND_USER themselves).
os.environ.setdefault("TOLLGATE_COMMANDS_AS_CONSUMER", "1")
os.environ.setdefault("TOLLGATE_AUDIT_KEY_FILE", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var",
    f"audit-key-test-{os.getpid()}.pem"))

from tollgate.settings import *  # noqa: E402,F403
from tollgate.settings import DATABASES, HUEY, VAR_DIR  # noqa: E402

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory: threads and consumer processes must see the same database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Tests ring the queue only where they run a consumer and say so.
TOLLGATE_DISPATCH = False
TOLLGATE_NOTIFY = False
TOLLGATE_WEBHOOKS = False
# The group-commit watcher records in a connection of its own, which cannot see the open
# transaction most tests run in: in the test process it waits a minute, so a batch records
# at its end (the test of the watcher sets the hold it needs; consumers keep the default).
TOLLGATE_GROUP_COMMIT_HOLD_SECONDS = 60
HUEY = {**HUEY, "name": f"tollgate-test-{os.getpid()}"}
if HUEY["huey_class"] == "huey.SqliteHuey":
    HUEY["filename"] = str(VAR_DIR / f"huey-test-{os.getpid()}.sqlite3")
# Page versions of this test session alone, named as its consumers name them (by the queue).
TOLLGATE_LIVE_FILE = str(VAR_DIR / f"live-{HUEY['name']}.sqlite3")
TOLLGATE_LIVE_PREFIX = HUEY["name"] + "-live:"
# Each test's database is new: the seal chain's head a whole check keeps between runs (outside
# the database) is kept only where a test asks for it.
TOLLGATE_AUDIT_HEAD_FILE = ""
# DKIM keys of replies are looked up in the records the tests publish (tests/support/mail.py).
TOLLGATE_DKIM_DNS = "tests.support.mail.dns_txt"
