"""Tollgate settings, read from the environment (see docs/operators.md "Configuration")."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TOLLGATE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
# Prometheus metrics from every process (gunicorn workers, Huey consumers) are files here,
# added up at scrape time; set before prometheus_client is imported anywhere.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "metrics"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    # The embedded default, DEBUG or not, keeps a generated key under var/ (readable by its
    # owner only): a fixed key would let anyone mint sessions and decision links.
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        import secrets
        import tempfile

        # Written whole, then linked into place: processes starting at once agree on one key.
        descriptor, draft = tempfile.mkstemp(dir=VAR_DIR)  # mode 0600
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, key_file)
        except FileExistsError:
            pass
        finally:
            os.unlink(draft)
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "axes",
    "ninja",
    "goals",
    # Before Huey's app: its `run_huey` (which refuses an unsafe consumer) is the one run.
    "workflows",
    "huey.contrib.djhuey",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "workflows.sso.middleware.SessionAge",
    "workflows.sso.middleware.SsoRecheck",
    "workflows.web.middleware.ViewerTimeZone",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # Last, as django-axes asks: it answers a locked-out sign-in.
    "axes.middleware.AxesMiddleware",
]

# Login throttling by django-axes: failed sign-ins are counted in the database, so the limit
# holds across every web process, and the admin's login is covered too. A username is locked
# for AXES_COOLOFF_TIME after AXES_FAILURE_LIMIT failures from one address.
# No "AXES: BEGIN version …" banner on every command and process start.
AXES_VERBOSE = False
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Passwords, refused to all but break-glass accounts when sign-on is the only way in.
    "workflows.sso.backends.PasswordBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("TOLLGATE_LOGIN_FAILURES", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("TOLLGATE_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_IPWARE_PROXY_COUNT = int(os.environ.get("TOLLGATE_PROXY_COUNT", "0")) or None

# Content-Security-Policy (Django's own): scripts only from here with the page's nonce (htmx
# is served by django-htmx with it), no inline styles or handlers, no framing.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF, *([urlsplit(os.environ["TOLLGATE_LIVE_EVENTS_URL"])._replace(
        path="", query="", fragment="").geturl()]
        if "://" in os.environ.get("TOLLGATE_LIVE_EVENTS_URL", "") else [])],
    # Signing out also signs out at the sign-on provider: the form's redirect goes there.
    "form-action": [CSP.SELF, *([urlsplit(os.environ["TOLLGATE_OIDC_ISSUER"])._replace(
        path="", query="", fragment="").geturl()] if os.environ.get("TOLLGATE_OIDC_ISSUER")
        else [])],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "object-src": [CSP.NONE],
}

ROOT_URLCONF = "tollgate.urls"
WSGI_APPLICATION = "tollgate.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
                "workflows.web.context_processors.inbox",
            ],
        },
    },
]



def parse_database_url(url: str) -> dict:
    """dj-database-url's settings, plus libpq's several hosts for a primary and its standbys:
    postgres://user@db1:5432,db2:5432/tollgate?target_session_attrs=read-write connects to
    whichever of them is the primary now (docs/operators.md, "A database that fails over")."""
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    hosts = netloc.split(",") if sep and "," in netloc else []
    if hosts:
        rest = rest.replace(netloc, hosts[0], 1)
    db = dj_database_url.parse(
        f"{scheme}{sep}{rest}",
        # Workers run many short tasks: reopening a PostgreSQL connection for each would cost
        # more than the task. Health checks replace a connection the server dropped.
        conn_max_age=int(os.environ.get("TOLLGATE_CONN_MAX_AGE", "300")),
        conn_health_checks=True,
    )
    if hosts:
        pairs = [host.rpartition(":") if ":" in host else (host, "", "5432") for host in hosts]
        db["HOST"] = ",".join(host for host, _, _ in pairs)
        db["PORT"] = ",".join(port for _, _, port in pairs)
    return db


DATABASES = {
    "default": parse_database_url(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'tollgate.sqlite3'}")),
}
# Behind PgBouncer in transaction pooling mode a server connection serves another client
# after each transaction: no server-side cursors, and (before PgBouncer 1.21) no prepared
# statements.
TOLLGATE_PGBOUNCER = env_bool("TOLLGATE_PGBOUNCER", False)
TOLLGATE_PG_PREPARE = env_bool("TOLLGATE_PG_PREPARE", True) and not TOLLGATE_PGBOUNCER
if TOLLGATE_PGBOUNCER:
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The rollups of a big goal tree are estimated costly enough for PostgreSQL's JIT, whose
    # compiling then takes longer than the query (0.9 s of a 1.2 s goal page at 100k runs).
    # PgBouncer drops this startup option: there, `ALTER DATABASE ... SET jit = off`.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c jit=off"
    # A connection cut off by a network partition fails after this long, instead of hanging
    # through TCP's minutes of retransmissions (libpq's tcp_user_timeout, for data sent and
    # not acknowledged), and an idle pooled one is probed (keepalives) so a dead one is found.
    # A long query is not cut: the server acknowledges it while it runs.
    for option, value in (
        ("tcp_user_timeout", int(float(os.environ.get(
            "TOLLGATE_PG_TCP_USER_TIMEOUT_SECONDS", "30")) * 1000)),
        ("keepalives", 1), ("keepalives_idle", 30), ("keepalives_interval", 10),
        ("keepalives_count", 3),
    ):
        DATABASES["default"]["OPTIONS"].setdefault(option, value)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN,
    # so two transitions on one run queue up instead of failing with "database is locked".
    # synchronous=FULL: a commit is on disk before it is acknowledged, so a power cut loses
    # no transition. NORMAL (TOLLGATE_SQLITE_SYNCHRONOUS=NORMAL) is faster and can lose the
    # last transitions, never corrupt the database.
    synchronous = os.environ.get("TOLLGATE_SQLITE_SYNCHRONOUS", "FULL").upper()
    if synchronous not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError("TOLLGATE_SQLITE_SYNCHRONOUS must be FULL, NORMAL or EXTRA")
    DATABASES["default"]["OPTIONS"] = {
        "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous};",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Filled by collectstatic; WhiteNoise serves it (an image collects them outside its volume).
STATIC_ROOT = Path(os.environ.get("TOLLGATE_STATIC_ROOT", VAR_DIR / "static"))
STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inbox"
LOGOUT_REDIRECT_URL = "login"

# Production hardening; all of it is on unless DEBUG.
SESSION_COOKIE_SECURE = not DEBUG and env_bool("TOLLGATE_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = not DEBUG and env_bool("TOLLGATE_SSL_REDIRECT", True)
# Probes and scrapes come over plain HTTP from inside the cluster or the container.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = 0 if DEBUG else int(os.environ.get("TOLLGATE_HSTS_SECONDS", "31536000"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Email: the console in development, SMTP in production (TOLLGATE_SMTP_* below).
EMAIL_BACKEND_PATH = os.environ.get(
    "TOLLGATE_EMAIL_BACKEND",
    "workflows.delivery.mail.ReadableConsoleBackend"
    if DEBUG
    else "django.core.mail.backends.smtp.EmailBackend",
)
MAILERS = {"default": {"BACKEND": EMAIL_BACKEND_PATH}}
if EMAIL_BACKEND_PATH.endswith("smtp.EmailBackend"):
    MAILERS["default"]["OPTIONS"] = {
        "host": os.environ.get("TOLLGATE_SMTP_HOST", "localhost"),
        "port": int(os.environ.get("TOLLGATE_SMTP_PORT", "25")),
        "username": os.environ.get("TOLLGATE_SMTP_USER", ""),
        "password": os.environ.get("TOLLGATE_SMTP_PASSWORD", ""),
        "use_tls": env_bool("TOLLGATE_SMTP_TLS", False),
        "timeout": 10,
    }
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "tollgate@localhost")

# Huey: the queue is only a doorbell; step rows and leases in the database are the truth.
REDIS_URL = os.environ.get("TOLLGATE_REDIS_URL", "")
HUEY_FILE = os.environ.get("TOLLGATE_HUEY_FILE", str(VAR_DIR / "huey.sqlite3"))
if REDIS_URL:
    HUEY = {
        # A sorted set: doorbells carry their run's priority, periodic tasks go first.
        "huey_class": "huey.PriorityRedisHuey",
        "name": os.environ.get("TOLLGATE_HUEY_NAME", "tollgate"),
        "url": REDIS_URL,
        "immediate": False,
        "consumer": {"workers": 4, "worker_type": "thread"},
    }
else:
    HUEY = {
        "huey_class": "huey.SqliteHuey",
        "name": os.environ.get("TOLLGATE_HUEY_NAME", "tollgate"),
        "filename": HUEY_FILE,
        "immediate": False,
        # SqliteHuey polls (a cheap read while the queue is empty): keep the gap between a
        # doorbell and a worker short.
        "consumer": {"workers": 4, "worker_type": "thread", "initial_delay": 0.005,
                     "backoff": 1.5, "max_delay": 0.02},
    }

# What open pages poll for: a version per person, group and run, kept outside the database
# (Redis where there is one, else a small SQLite file of its own beside the database) so
# that a poll that finds nothing changed touches neither the session nor the database
# (workflows.reads.live).
TOLLGATE_LIVE_REDIS_URL = REDIS_URL
TOLLGATE_LIVE_FILE = str(VAR_DIR / f"live-{HUEY['name']}.sqlite3")
TOLLGATE_LIVE_PREFIX = HUEY["name"] + "-live:"
# How long a page's list of what to watch holds before a poll reads the database again
# (what changes with time alone, such as an away period starting, shows within it).
TOLLGATE_LIVE_MAX_AGE = int(os.environ.get("TOLLGATE_LIVE_MAX_AGE", "120"))
# How often a page holding an event stream asks anyway (its stream's safety net).
TOLLGATE_LIVE_SLOW_POLL_SECONDS = int(os.environ.get("TOLLGATE_LIVE_SLOW_POLL_SECONDS", "30"))
# How many event streams one person may hold open at once on one events process.
TOLLGATE_LIVE_STREAMS_PER_PERSON = int(os.environ.get("TOLLGATE_LIVE_STREAMS_PER_PERSON", "20"))
# Where open pages hold a server-sent events stream instead of polling each second
# (tollgate.events, served by uvicorn; "/live/events" behind the same host as the pages).
# Empty: pages poll. While a stream is down a page polls each second until it is back.
TOLLGATE_LIVE_EVENTS_URL = os.environ.get("TOLLGATE_LIVE_EVENTS_URL", "")

TOLLGATE_LEASE_SECONDS = float(os.environ.get("TOLLGATE_LEASE_SECONDS", "30"))
TOLLGATE_SWEEP_SECONDS = int(os.environ.get("TOLLGATE_SWEEP_SECONDS", "10"))
# Reminders for gates whose spec declares none (0: none): the first this many seconds after
# a gate starts waiting, then one every TOLLGATE_REMIND_EVERY_SECONDS, up to its deadline.
TOLLGATE_REMIND_AFTER_SECONDS = float(os.environ.get("TOLLGATE_REMIND_AFTER_SECONDS", "0"))
TOLLGATE_REMIND_EVERY_SECONDS = float(os.environ.get("TOLLGATE_REMIND_EVERY_SECONDS", "0"))
# Dotted paths a spec's `callable` may name; an entry ending in ".*" allows a whole module.
# Who reads runs (pages, outputs, params, state, audit exports, the API): "all" signed-in
# people, or "involved": a run's requester, members of its gates' groups, operators
# (operate_run), auditors (export_audit) and superusers.
TOLLGATE_RUN_VISIBILITY = os.environ.get("TOLLGATE_RUN_VISIBILITY", "all")
if TOLLGATE_RUN_VISIBILITY not in ("all", "involved"):
    raise ValueError("TOLLGATE_RUN_VISIBILITY must be all or involved")
# A run holds at most this many steps (a spec's and those added while it runs).
TOLLGATE_MAX_STEPS_PER_RUN = int(os.environ.get("TOLLGATE_MAX_STEPS_PER_RUN", "1000"))
# Runs inside runs nest at most this deep (a spec cycle through `workflow` steps ends here).
TOLLGATE_MAX_RUN_DEPTH = int(os.environ.get("TOLLGATE_MAX_RUN_DEPTH", "5"))
# Retention, in days: older records that only explain the past are pruned hourly (runs
# themselves only by manage.py prune_runs, which exports them first).
TOLLGATE_KEEP_DELIVERIES_DAYS = float(os.environ.get("TOLLGATE_KEEP_DELIVERIES_DAYS", "30"))
TOLLGATE_KEEP_NOTIFICATIONS_DAYS = float(os.environ.get("TOLLGATE_KEEP_NOTIFICATIONS_DAYS",
                                                        "90"))
TOLLGATE_KEEP_SCHEDULE_FIRES_DAYS = float(os.environ.get("TOLLGATE_KEEP_SCHEDULE_FIRES_DAYS",
                                                         "90"))
TOLLGATE_KEEP_OUTBOX_DAYS = float(os.environ.get("TOLLGATE_KEEP_OUTBOX_DAYS", "7"))
# The audit chain's seals (workflows.audit.seals): the Ed25519 key that signs them (made
# here on first use when unset: keep it where database users cannot read it), and how often.
TOLLGATE_AUDIT_KEY_FILE = os.environ.get("TOLLGATE_AUDIT_KEY_FILE",
                                         str(VAR_DIR / "audit-key.pem"))
# Its public half, which is all the web server and verify_audit read (the sealer writes it
# beside the key: the key's path with ".pub" unless this names another).
TOLLGATE_AUDIT_PUBLIC_KEY_FILE = os.environ.get("TOLLGATE_AUDIT_PUBLIC_KEY_FILE", "")
# Where verify_audit keeps the seal chain's head between whole checks, outside the database
# (workflows.audit.head; empty: not kept).
TOLLGATE_AUDIT_HEAD_FILE = os.environ.get("TOLLGATE_AUDIT_HEAD_FILE",
                                          str(VAR_DIR / "audit-head.json"))
TOLLGATE_AUDIT_SEAL_SECONDS = float(os.environ.get("TOLLGATE_AUDIT_SEAL_SECONDS", "600"))
# An RFC 3161 timestamp authority for the seal chain (its URL; off when empty), and the PEM
# file of the root certificate(s) its answers must chain to (required with the URL).
TOLLGATE_AUDIT_TSA_URL = os.environ.get("TOLLGATE_AUDIT_TSA_URL", "")
TOLLGATE_AUDIT_TSA_CA_FILE = os.environ.get("TOLLGATE_AUDIT_TSA_CA_FILE", "")
# OpenTelemetry tracing (the otel extra): requests and worker attempts as spans, sent to the
# OTLP endpoint OTEL_EXPORTER_OTLP_ENDPOINT names.
TOLLGATE_OTEL = env_bool("TOLLGATE_OTEL", False)
# /metrics answers a Bearer token (when set) or else only these networks.
TOLLGATE_METRICS_TOKEN = os.environ.get("TOLLGATE_METRICS_TOKEN", "")
TOLLGATE_METRICS_ALLOW = env_list("TOLLGATE_METRICS_ALLOW") or ["127.0.0.1/32", "::1/128"]
TOLLGATE_CALLABLES = env_list("TOLLGATE_CALLABLES", "workflows.callables.*")
# Extra environment variable names whose values are redacted from stored output.
TOLLGATE_REDACT_ENV = env_list("TOLLGATE_REDACT_ENV")
# Commands and shell steps get a clean environment: these variables of the worker's (when
# set), then the spec's `env`. Nothing else of the worker's leaks into a step.
# Secrets a spec names ({"secret": "deploy"} as an env value) are read on the worker from
# TOLLGATE_SECRET_<NAME> in its environment, or from a file named NAME in this directory.
TOLLGATE_SECRETS_DIR = os.environ.get("TOLLGATE_SECRETS_DIR", "")
# Which specs may name which secrets (JSON): {"release": ["deploy"], "data-*": ["warehouse.*"]},
# spec names or patterns to secret names or patterns. A secret granted to no spec is refused.
TOLLGATE_SECRET_GRANTS = json.loads(os.environ.get("TOLLGATE_SECRET_GRANTS", "{}"))
if not isinstance(TOLLGATE_SECRET_GRANTS, dict) or not all(
        isinstance(v, list) and all(isinstance(n, str) for n in v)
        for v in TOLLGATE_SECRET_GRANTS.values()):
    raise ValueError("TOLLGATE_SECRET_GRANTS must map spec names to lists of secret names")
# Run commands as this operating-system user (the worker must be root or hold CAP_SETUID), so
# a command cannot read the worker's memory, environment or files. Empty: the worker's user.
TOLLGATE_COMMAND_USER = os.environ.get("TOLLGATE_COMMAND_USER", "")
# What this process's container or machine runs, for the deploy checks: "web" (the web app
# and events server: no commands, no signing key), "consumer", or "all" (one machine).
TOLLGATE_ROLE = os.environ.get("TOLLGATE_ROLE", "all")
# Without a command user, `run_huey` refuses to start unless DEBUG or this says the risk is
# taken: commands then run as the consumer's own account, which reads the audit's signing key.
TOLLGATE_COMMANDS_AS_CONSUMER = env_bool("TOLLGATE_COMMANDS_AS_CONSUMER", False)
# One folder per running command's attempt; its result is kept there until it is recorded.
# Keep it on a disk that survives the consumer (not a tmpfs that a container loses).
TOLLGATE_SPOOL_DIR = os.environ.get("TOLLGATE_SPOOL_DIR", str(VAR_DIR / "spool"))
# Coding agents: provider -> argv with "{prompt}" (JSON), over the documented defaults.
TOLLGATE_AGENT_COMMANDS = json.loads(os.environ.get("TOLLGATE_AGENT_COMMANDS", "{}"))
# Accounts: profile -> {KEY: VALUE} (JSON), else a command printing `export KEY=VALUE` lines
# (argv with "{tool}" and "{profile}", JSON), the tool defaulting from the agent's provider.
TOLLGATE_ACCOUNTS = json.loads(os.environ.get("TOLLGATE_ACCOUNTS", "{}"))
TOLLGATE_ACCOUNT_COMMAND = json.loads(os.environ.get("TOLLGATE_ACCOUNT_COMMAND", "[]"))
TOLLGATE_ACCOUNT_TOOLS = json.loads(os.environ.get("TOLLGATE_ACCOUNT_TOOLS", "{}"))
TOLLGATE_COMMAND_ENV = env_list("TOLLGATE_COMMAND_ENV", "PATH,HOME,LANG,LC_ALL,TZ,TMPDIR")
TOLLGATE_OUTPUT_CAP = int(os.environ.get("TOLLGATE_OUTPUT_CAP", str(64 * 1024)))
# Ring doorbells on Huey for newly ready steps after each transition commits.
TOLLGATE_DISPATCH = env_bool("TOLLGATE_DISPATCH", True)
# At most this many doorbells per transition: each wakes a worker that keeps claiming while
# any run has work, so a fan-out of thousands needs no more than there are workers.
TOLLGATE_WAKE_LIMIT = int(os.environ.get("TOLLGATE_WAKE_LIMIT", "32"))
# How long a worker keeps claiming steps for one doorbell before it lets the queue's other
# tasks have their turn (it rings again if work remains).
TOLLGATE_WORKER_BATCH_SECONDS = float(os.environ.get("TOLLGATE_WORKER_BATCH_SECONDS", "2"))
# Group commits: a worker thread claims up to this many ready steps of different runs at
# once and records their outcomes (and claims its next ones) in one transaction; 1 turns
# them off. The batch is as large as the work waiting: a lone chain goes one step at a time.
TOLLGATE_GROUP_COMMIT_STEPS = int(os.environ.get("TOLLGATE_GROUP_COMMIT_STEPS", "8"))
# The longest a finished step's outcome waits for the rest of its batch before it is
# recorded on its own.
TOLLGATE_GROUP_COMMIT_HOLD_SECONDS = float(
    os.environ.get("TOLLGATE_GROUP_COMMIT_HOLD_SECONDS", "0.005"))

# One line per event: the "huey" logger has our handler and does not propagate, so Huey's
# consumer adds no handler of its own (it would print each line twice).
# TOLLGATE_LOG_FORMAT=json writes one JSON object per line (for a log pipeline); either way a
# line written while a step is worked on names its run, step and attempt.
LOG_FORMAT = os.environ.get("TOLLGATE_LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "tollgate.logs.Context"},
                "quiet": {"()": "tollgate.logs.Quiet"}},
    "formatters": {
        "text": {"format": "[%(asctime)s] %(levelname)s %(name)s%(where)s: %(message)s"},
        "json": {"()": "tollgate.logs.Json"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["context", "quiet"],
                             "formatter": "json" if LOG_FORMAT == "json" else "text"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Once, through the one console handler (Django's own would print it again).
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "huey": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO"),
                 "propagate": False},
        # Sign-ins and lockouts at INFO are django-axes' own chatter; warnings still show.
        "axes": {"level": "WARNING"},
    },
}
# Seconds between SIGTERM and SIGKILL when a step's process group is stopped.
TOLLGATE_KILL_GRACE_SECONDS = float(os.environ.get("TOLLGATE_KILL_GRACE_SECONDS", "5"))
# How long a worker keeps retrying to report a finished attempt while the database is away.
TOLLGATE_REPORT_RETRY_SECONDS = float(os.environ.get("TOLLGATE_REPORT_RETRY_SECONDS", "300"))
# Email people about gates and failed runs (through Huey, after the transition commits).
TOLLGATE_NOTIFY = env_bool("TOLLGATE_NOTIFY", True)
# Post gate events to the groups' webhooks (through Huey, after the transition commits).
TOLLGATE_WEBHOOKS = env_bool("TOLLGATE_WEBHOOKS", True)
# Where people reach this Tollgate: the absolute links in mail and webhooks are built on it
# (a system check requires it in production). `make run` serves on localhost:8000.
TOLLGATE_BASE_URL = os.environ.get(
    "TOLLGATE_BASE_URL", "http://localhost:8000" if DEBUG else "").rstrip("/")
# The WebAuthn relying party passkeys are made for: by default the host the browser is on.
# Set it to the registrable domain to let one passkey serve several hosts under it.
TOLLGATE_PASSKEY_RP_ID = os.environ.get("TOLLGATE_PASSKEY_RP_ID", "")
# A passkey is added only by a session signed in this recently (a fresh proof of who adds it).
TOLLGATE_PASSKEY_ENROL_SECONDS = int(os.environ.get("TOLLGATE_PASSKEY_ENROL_SECONDS", "600"))
# Webhooks post to https URLs with public addresses; http only to these hosts, and private,
# loopback or link-local addresses only when allowed (a receiver inside your network).
TOLLGATE_WEBHOOK_HTTP_HOSTS = [h.lower() for h in env_list("TOLLGATE_WEBHOOK_HTTP_HOSTS")]
TOLLGATE_WEBHOOK_ALLOW_PRIVATE = env_bool("TOLLGATE_WEBHOOK_ALLOW_PRIVATE", False)
# How long a signed decision link in a mail works, at most (it stops working as soon as its
# gate is decided or a new attempt starts).
TOLLGATE_DECISION_LINK_DAYS = int(os.environ.get("TOLLGATE_DECISION_LINK_DAYS", "14"))
# Replies that decide (workflows/inbound): a gate's mail is answered to a per-person address
# at this domain, whose mail reaches `manage.py receive_mail` or the anymail webhook. Empty:
# off, the mail says to use its link.
TOLLGATE_REPLY_DOMAIN = os.environ.get("TOLLGATE_REPLY_DOMAIN", "").strip().lower()
# A reply decides only when its sender's domain is authenticated: by its own DKIM signature,
# or by an Authentication-Results header of one of these relays (their authserv-id), which
# must remove such headers bearing its name from what it receives (RFC 8601, section 5).
TOLLGATE_INBOUND_TRUSTED_RELAYS = [h.lower() for h in env_list("TOLLGATE_INBOUND_TRUSTED_RELAYS")]
# How DKIM keys are looked up: a dotted path to a function (name: bytes, timeout=5) -> bytes
# of the TXT record; empty: the DNS resolver (dnspython).
TOLLGATE_DKIM_DNS = os.environ.get("TOLLGATE_DKIM_DNS", "")


def env_json(name: str, default, kind: type, what: str):
    """A JSON setting of a given shape, or a clear error naming the variable."""
    try:
        value = json.loads(os.environ.get(name, "") or json.dumps(default))
    except ValueError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, kind) or (kind is dict and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
        raise ValueError(f"{name} must be {what}")
    return value


# Push notifications to people's browsers and phones (Web Push with VAPID): the private key
# (a PEM file, made at first use when missing; every web and consumer process must read the
# same one) and the contact the push services are given. Unset: no push (check --deploy
# says so).
TOLLGATE_VAPID_KEY_FILE = os.environ.get("TOLLGATE_VAPID_KEY_FILE", "")
TOLLGATE_VAPID_SUBJECT = os.environ.get("TOLLGATE_VAPID_SUBJECT", "")
# Replies through a hosted mail service's inbound webhook (django-anymail, at
# /anymail/<service>/inbound/): the webhook's shared secret ("user:password", which the
# service sends as basic authentication); empty: off. TOLLGATE_ANYMAIL holds the service's
# own settings, such as MAILGUN_WEBHOOK_SIGNING_KEY (a JSON object).
TOLLGATE_ANYMAIL_WEBHOOK_SECRET = os.environ.get("TOLLGATE_ANYMAIL_WEBHOOK_SECRET", "")
if TOLLGATE_ANYMAIL_WEBHOOK_SECRET:
    INSTALLED_APPS.append("anymail")
    ANYMAIL = {**env_json("TOLLGATE_ANYMAIL", {}, dict, "an object of anymail settings"),
               "WEBHOOK_SECRET": TOLLGATE_ANYMAIL_WEBHOOK_SECRET}

# Single sign-on with OpenID Connect (workflows/sso): on when an issuer is set. Accounts are
# made or updated at each sign-in, and groups follow the provider's group claim.
TOLLGATE_OIDC_ISSUER = os.environ.get("TOLLGATE_OIDC_ISSUER", "").rstrip("/")
TOLLGATE_OIDC_CLIENT_ID = os.environ.get("TOLLGATE_OIDC_CLIENT_ID", "")
TOLLGATE_OIDC_CLIENT_SECRET = os.environ.get("TOLLGATE_OIDC_CLIENT_SECRET", "")
TOLLGATE_OIDC_SCOPES = os.environ.get("TOLLGATE_OIDC_SCOPES", "openid email profile")
TOLLGATE_OIDC_GROUPS_CLAIM = os.environ.get("TOLLGATE_OIDC_GROUPS_CLAIM", "groups")
# Claim value -> group name (Entra ID sends group ids). When set, only the groups it names
# are kept in step with the provider; without it every group follows the claim.
TOLLGATE_OIDC_GROUP_MAP = env_json("TOLLGATE_OIDC_GROUP_MAP", {}, dict,
                                   "an object of claim value to group name")
TOLLGATE_OIDC_LABEL = os.environ.get("TOLLGATE_OIDC_LABEL", "your company account")
# A claim holding the e-mail of the person's manager (a gate's `manager` rule): when set,
# each sign-in sets the person's manager from it. Empty: managers are set in the admin.
TOLLGATE_OIDC_MANAGER_CLAIM = os.environ.get("TOLLGATE_OIDC_MANAGER_CLAIM", "")
# Sign-on is the only way in, but for these usernames (break-glass accounts, with passwords).
TOLLGATE_OIDC_ONLY = env_bool("TOLLGATE_OIDC_ONLY", False)
TOLLGATE_BREAK_GLASS = env_list("TOLLGATE_BREAK_GLASS")
if TOLLGATE_OIDC_ONLY and not TOLLGATE_OIDC_ISSUER:
    raise ValueError("TOLLGATE_OIDC_ONLY needs TOLLGATE_OIDC_ISSUER")
# A signed-in session older than this (seconds since sign-in) must sign in again; 0: never.
# The API's OpenAPI document and docs page for anonymous callers (signed-in people and
# tokens always read them): on while developing, off in production unless said.
TOLLGATE_API_DOCS_PUBLIC = env_bool("TOLLGATE_API_DOCS_PUBLIC", DEBUG)
TOLLGATE_SESSION_MAX_AGE = int(os.environ.get("TOLLGATE_SESSION_MAX_AGE", str(12 * 3600)))
# A session signed in through the provider is checked there again (prompt=none) this often,
# so groups removed or a person disabled at the provider take effect within it (0: never).
TOLLGATE_OIDC_RECHECK_SECONDS = int(os.environ.get("TOLLGATE_OIDC_RECHECK_SECONDS", "900"))
# An API token of a person who signs in through the provider works only while the provider
# vouched for them (a sign-in or a check) within this many seconds (0: tokens do not follow).
TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS = int(os.environ.get(
    "TOLLGATE_OIDC_TOKENS_FOLLOW_SECONDS", str(24 * 3600)))

# Slack approvals (workflows/chat): on when both the bot token and the signing secret are set.
TOLLGATE_SLACK_BOT_TOKEN = os.environ.get("TOLLGATE_SLACK_BOT_TOKEN", "")
TOLLGATE_SLACK_SIGNING_SECRET = os.environ.get("TOLLGATE_SLACK_SIGNING_SECRET", "")
# Approval group -> Slack channel id (a gate is posted to its group's channel).
TOLLGATE_SLACK_CHANNELS = env_json("TOLLGATE_SLACK_CHANNELS", {}, dict,
                                   "an object of approval group to Slack channel id")
TOLLGATE_SLACK_API_URL = os.environ.get("TOLLGATE_SLACK_API_URL", "https://slack.com/api/")
# How long a call to Slack's Web API may take before it is retried through the outbox.
TOLLGATE_SLACK_TIMEOUT_SECONDS = float(os.environ.get("TOLLGATE_SLACK_TIMEOUT_SECONDS", "10"))

# Microsoft Teams approvals (workflows/chat/teams.py): on when the app (bot) id, its client
# secret and the Entra tenant are set (docs/approvers.md, "Approvals in Microsoft Teams").
TOLLGATE_TEAMS_APP_ID = os.environ.get("TOLLGATE_TEAMS_APP_ID", "")
TOLLGATE_TEAMS_APP_PASSWORD = os.environ.get("TOLLGATE_TEAMS_APP_PASSWORD", "")
TOLLGATE_TEAMS_TENANT_ID = os.environ.get("TOLLGATE_TEAMS_TENANT_ID", "")
# Approval group -> Teams channel id ("19:...@thread.tacv2").
TOLLGATE_TEAMS_CHANNELS = env_json("TOLLGATE_TEAMS_CHANNELS", {}, dict,
                                   "an object of approval group to Teams channel id")
# The Bot Connector of the tenant's region, where cards are posted and updated.
TOLLGATE_TEAMS_SERVICE_URL = os.environ.get("TOLLGATE_TEAMS_SERVICE_URL",
                                            "https://smba.trafficmanager.net/teams/")
# Where the app's token comes from ("" : the tenant's Entra token endpoint).
TOLLGATE_TEAMS_TOKEN_URL = os.environ.get("TOLLGATE_TEAMS_TOKEN_URL", "")
# Whose keys sign the requests Teams sends, and the issuer they name.
TOLLGATE_TEAMS_OPENID_URL = os.environ.get(
    "TOLLGATE_TEAMS_OPENID_URL",
    "https://login.botframework.com/v1/.well-known/openidconfiguration")
TOLLGATE_TEAMS_ISSUER = os.environ.get("TOLLGATE_TEAMS_ISSUER", "https://api.botframework.com")
TOLLGATE_TEAMS_TIMEOUT_SECONDS = float(os.environ.get("TOLLGATE_TEAMS_TIMEOUT_SECONDS", "10"))
