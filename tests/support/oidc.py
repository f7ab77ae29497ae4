"""A real OpenID Connect provider process (panva's oidc-provider on Node.js, with its
development login page) on 127.0.0.1, for the sign-on tests (tests/browser/conftest.py
offers the fixture)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .processes import listener

PROVIDER_DIR = Path(__file__).parent / "oidc_provider"
CLIENT_ID, CLIENT_SECRET = "tollgate", "client-secret-for-tests"


class Provider:
    def __init__(self, url: str, users_file: Path):
        self.url, self.users_file = url, users_file

    def set_users(self, users: dict) -> None:
        """Who exists at the provider, with their e-mail and groups (read at each sign-in)."""
        self.users_file.write_text(json.dumps(users))


@pytest.fixture
def oidc_provider(live_server, settings, tmp_path):
    """The provider, with Tollgate (the live server) registered as its client and pointed
    at it."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is needed for the sign-on tests (apt-get install nodejs npm)")
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PROVIDER_DIR, check=True)
    sock = listener()  # handed to the provider: a port nobody else can take meanwhile
    port = sock.getsockname()[1]
    users = tmp_path / "users.json"
    users.write_text("{}")
    client = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
              "redirect_uris": [f"{live_server.url}/sso/callback/"],
              "post_logout_redirect_uris": [f"{live_server.url}/login/"]}
    process = subprocess.Popen(
        [node, "server.mjs"], cwd=PROVIDER_DIR, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, pass_fds=(sock.fileno(),),
        env={**os.environ, "PORT": str(port), "LISTEN_FD": str(sock.fileno()),
             "USERS_FILE": str(users),
             "CLIENT": json.dumps(client)})
    try:
        line = process.stdout.readline()  # "listening ..." once it accepts connections
        assert line.startswith("listening"), f"the provider did not start: {line!r}"
        url = f"http://127.0.0.1:{port}"
        settings.TOLLGATE_OIDC_ISSUER = url
        settings.TOLLGATE_OIDC_CLIENT_ID = CLIENT_ID
        settings.TOLLGATE_OIDC_CLIENT_SECRET = CLIENT_SECRET
        settings.TOLLGATE_OIDC_SCOPES = "openid email profile groups"
        settings.TOLLGATE_OIDC_LABEL = "Acme"
        settings.TOLLGATE_BASE_URL = live_server.url
        # As settings.py does for TOLLGATE_OIDC_ISSUER: sign-out's redirect goes there.
        settings.SECURE_CSP = {**settings.SECURE_CSP,
                               "form-action": [*settings.SECURE_CSP["form-action"], url]}
        yield Provider(url, users)
    finally:
        process.terminate()
        process.wait(10)
        sock.close()
