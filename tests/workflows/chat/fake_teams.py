"""A stand-in for Microsoft Teams on 127.0.0.1: the Bot Connector's REST calls Tollgate makes
(conversations, activities, members), the Entra token endpoint, and the Bot Framework's OpenID
metadata and keys, with a signing key of its own; it keeps the channels' messages as Teams
would show them, and sends Tollgate activities signed as the Bot Framework signs them."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

TENANT = "7b1a2c3d-0000-4000-8000-acme00000001"
APP_ID = "5f6e7d8c-0000-4000-8000-b0700000tg01"
APP_PASSWORD = "teams-client-secret-for-tests"
ISSUER = "https://api.botframework.com"
ACCESS_TOKEN = "teams-access-token"


def object_id(name: str) -> str:
    """A person's Entra object id, stable per name."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.acme.test"))


def new_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeTeams:
    def __init__(self):
        self.port = 0  # the OS chooses at the first start; a restart keeps it
        self.key = new_key()
        self.kid = "tollgate-test-key"
        # The Bot Framework signs every channel's tokens; each key is endorsed for the
        # channels it may sign for. This one signs Web Chat's and Direct Line's, which any
        # web page may drive, and must never decide a gate as Teams.
        self.web_key, self.web_kid = new_key(), "tollgate-webchat-key"
        self.calls: list[tuple[str, str, dict]] = []  # (method, path, body)
        self.roster: list[dict] = []  # the team's members, as pagedmembers answers
        self.channels: dict[str, list[dict]] = {}  # channel -> messages, oldest first
        self.personal: dict[str, list[str]] = {}  # member id -> texts sent to them
        self.threads: dict[str, list[str]] = {}  # thread conversation -> replies
        self.tokens_issued = 0
        # The Bot Connector takes each post and update but its answer is lost: "hang" (it
        # never comes, until `answers_back` is set) or "cut" (the connection closes).
        self.lose_answers: str | None = None
        self.answers_back = threading.Event()
        self._ids = 0
        self._lock = threading.Lock()
        self.server = None
        self.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return f"{self.base}/connector/"

    def settings(self) -> dict:
        return {"TOLLGATE_TEAMS_APP_ID": APP_ID, "TOLLGATE_TEAMS_APP_PASSWORD": APP_PASSWORD,
                "TOLLGATE_TEAMS_TENANT_ID": TENANT,
                "TOLLGATE_TEAMS_SERVICE_URL": self.service_url,
                "TOLLGATE_TEAMS_TOKEN_URL": f"{self.base}/token",
                "TOLLGATE_TEAMS_OPENID_URL": f"{self.base}/.well-known/openidconfiguration",
                "TOLLGATE_TEAMS_ISSUER": ISSUER}

    def member(self, name: str, email: str = "") -> dict:
        """Add a person to the team; their roster entry."""
        entry = {"id": f"29:{name}-teams-id", "name": name.capitalize() + " Smith",
                 "aadObjectId": object_id(name), "email": email,
                 "userPrincipalName": f"{name}@acme.test"}
        self.roster.append(entry)
        return entry

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, answer):
                payload = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _handle(self, method: str):
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size).decode() if size else ""
                path = urlsplit(self.path).path
                if path == "/token" and method == "POST":
                    form = {k: v[0] for k, v in parse_qs(raw).items()}
                    if (form.get("client_id"), form.get("client_secret")) != (
                            APP_ID, APP_PASSWORD):
                        return self._send(401, {"error": "invalid_client"})
                    fake.tokens_issued += 1
                    return self._send(200, {"access_token": ACCESS_TOKEN,
                                            "expires_in": 3600, "token_type": "Bearer"})
                if path == "/.well-known/openidconfiguration":
                    return self._send(200, {"issuer": ISSUER,
                                            "jwks_uri": f"{fake.base}/keys"})
                if path == "/keys":
                    public = json.loads(RSAAlgorithm.to_jwk(fake.key.public_key()))
                    web = json.loads(RSAAlgorithm.to_jwk(fake.web_key.public_key()))
                    return self._send(200, {"keys": [
                        {**public, "kid": fake.kid, "use": "sig", "endorsements": ["msteams"]},
                        {**web, "kid": fake.web_kid, "use": "sig",
                         "endorsements": ["webchat", "directline"]}]})
                if not path.startswith("/connector/"):
                    return self._send(404, {"error": "not found"})
                if self.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
                    return self._send(401, {"error": {"code": "Unauthorized"}})
                body = json.loads(raw) if raw else {}
                status, answer = fake.answer(method, path[len("/connector/"):],
                                             urlsplit(self.path).query, body)
                if fake.lose_answers and method in ("POST", "PUT"):
                    if fake.lose_answers == "cut":
                        self.close_connection = True
                        return None
                    fake.answers_back.wait()
                self._send(status, answer)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Teams away: nothing answers on its port."""
        self.answers_back.set()
        self.server.shutdown()
        self.server.server_close()

    # The Bot Connector -----------------------------------------------------------------

    def answer(self, method: str, path: str, query: str, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.calls.append((method, path, body))
            parts = [unquote(p) for p in path.split("/")]
            if method == "POST" and parts == ["v3", "conversations"]:
                if body.get("isGroup"):
                    channel = body["channelData"]["channel"]["id"]
                    self._ids += 1
                    activity_id = f"17000000000{self._ids:02d}"
                    self.channels.setdefault(channel, []).append(
                        {"id": activity_id, **body["activity"]})
                    return 201, {"id": f"{channel};messageid={activity_id}",
                                 "activityId": activity_id}
                [member] = body["members"]
                return 201, {"id": f"a:personal-{member['id']}"}
            if parts[:2] == ["v3", "conversations"] and len(parts) >= 4:
                conversation = parts[2]
                if method == "PUT" and parts[3] == "activities":
                    channel, _, activity_id = conversation.partition(";messageid=")
                    for posted in self.channels.get(channel, []):
                        if posted["id"] == activity_id == parts[4]:
                            posted.clear()
                            posted.update({**body, "id": activity_id})
                            return 200, {"id": activity_id}
                    return 404, {"error": {"code": "ActivityNotFoundInConversation"}}
                if method == "POST" and parts[3] == "activities":
                    if conversation.startswith("a:personal-"):
                        member = conversation[len("a:personal-"):]
                        self.personal.setdefault(member, []).append(body.get("text", ""))
                    else:
                        self.threads.setdefault(conversation, []).append(body.get("text", ""))
                    return 201, {"id": str(time.time_ns())}
                if method == "GET" and parts[3] == "pagedmembers":
                    return 200, {"members": self.roster}
                if method == "GET" and parts[3] == "members":
                    for entry in self.roster:
                        if entry["id"] == parts[4]:
                            return 200, entry
                    return 404, {"error": {"code": "MemberNotFoundInConversation"}}
            return 400, {"error": {"code": "BadSyntax", "message": f"{method} {path}"}}

    def cards(self, channel: str) -> list[dict]:
        """The cards in a channel as Teams shows them now (updates applied)."""
        with self._lock:
            return [m["attachments"][0]["content"] for m in self.channels.get(channel, [])]

    def calls_of(self, method: str, pattern: str) -> list[dict]:
        with self._lock:
            return [body for m, path, body in self.calls
                    if m == method and re.fullmatch(pattern, path)]

    # What Teams sends to Tollgate -----------------------------------------------------

    def token(self, *, key=None, audience: str = APP_ID, issuer: str = ISSUER,
              expires_in: int = 3600, service_url: str | None = None, kid: str | None = None):
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "nbf": now - 5, "iat": now - 5,
                  "exp": now + expires_in, "serviceUrl": service_url or self.service_url}
        return jwt.encode(claims, key or self.key, algorithm="RS256",
                          headers={"kid": kid or self.kid})

    def activity(self, gate, verb: str, member: dict, *, data: dict | None = None,
                 channel: str = "19:qa@thread.tacv2", tenant: str = TENANT,
                 channel_id: str = "msteams", seen: str | None = None) -> dict:
        """An Action.Execute on the gate's card, as Teams sends it (`channel_id`: as another
        Bot Framework channel would send it), from a view that showed the evidence as it is
        now (or as `seen`)."""
        from .fake_slack import shown

        seen = shown(gate) if seen is None else seen
        return {
            "type": "invoke", "name": "adaptiveCard/action", "id": str(uuid.uuid4()),
            "channelId": channel_id, "serviceUrl": self.service_url,
            "from": {"id": member["id"], "name": member["name"],
                     "aadObjectId": member["aadObjectId"]},
            "recipient": {"id": f"28:{APP_ID}"},
            "conversation": {"id": f"{channel};messageid=1700000000001",
                             "conversationType": "channel", "tenantId": tenant},
            "channelData": {"tenant": {"id": tenant}, "channel": {"id": channel}},
            "value": {"action": {"type": "Action.Execute", "verb": verb,
                                 "data": {"s": gate.pk, "a": gate.attempt, "e": seen,
                                          **(data or {})}},
                      "trigger": "manual"}}

    def send(self, url: str, activity: dict, token: str | None = "") -> tuple[int, dict]:
        """POST an activity to Tollgate with a bearer token (signed now unless given;
        None sends none); (status, answer)."""
        body = json.dumps(activity).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token()}"
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw.startswith(b"{") else {}
