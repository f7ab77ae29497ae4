"""A stand-in for Slack on 127.0.0.1: it answers the Web API methods Tollgate calls
(slack-sdk's base_url points here) and records each call, and it posts interaction payloads
to Tollgate signed with the signing secret, as Slack does."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

TEAM = "T0ACME"
SIGNING_SECRET = "slack-signing-secret-for-tests"
TOKEN = "xoxb-tests"



class FakeSlack:
    def __init__(self):
        self.port = 0  # the OS chooses at the first start; a restart keeps it
        self.calls: list[tuple[str, dict]] = []
        self.emails: dict[str, str] = {}  # Slack user id -> e-mail (users.info)
        self.posted: dict[str, list[dict]] = {}  # channel -> its messages, newest last
        self.post_delay = 0.0  # seconds chat.postMessage takes to answer (after posting)
        self._ts = 0
        self._lock = threading.Lock()
        self.server = None
        self.start()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(parse_qs(urlsplit(self.path).query))

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    data = json.loads(body or "{}")
                else:
                    data = parse_qs(body)
                self._answer(data)

            def _answer(self, data):
                data = {k: (v[0] if isinstance(v, list) and len(v) == 1 and k != "blocks"
                            else v) for k, v in data.items()}
                if isinstance(data.get("blocks"), str):
                    data["blocks"] = json.loads(data["blocks"])
                method = urlsplit(self.path).path.rsplit("/", 1)[-1]
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                answer = fake.answer(method, data) if ok else {"ok": False,
                                                               "error": "invalid_auth"}
                if method == "chat.postMessage" and fake.post_delay:
                    time.sleep(fake.post_delay)  # posted, but the answer comes late
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Slack away: nothing answers on its port."""
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, data: dict) -> dict:
        with self._lock:
            self.calls.append((method, data))
            if method == "chat.postMessage":
                self._ts += 1
                ts = f"1800000000.{self._ts:06d}"
                metadata = data.get("metadata")
                if isinstance(metadata, str):
                    metadata = json.loads(metadata)
                if not data.get("thread_ts"):
                    self.posted.setdefault(data["channel"], []).append(
                        {"ts": ts, "text": data.get("text", ""),
                         **({"metadata": metadata} if metadata else {})})
                return {"ok": True, "channel": data["channel"], "ts": ts}
            if method == "conversations.history":
                newest_first = list(reversed(self.posted.get(data["channel"], [])))
                limit = int(data.get("limit") or 100)
                if str(data.get("include_all_metadata")).lower() not in ("true", "1"):
                    newest_first = [{k: v for k, v in m.items() if k != "metadata"}
                                    for m in newest_first]
                return {"ok": True, "messages": newest_first[:limit]}
            if method in ("chat.update", "chat.postEphemeral", "views.open"):
                return {"ok": True}
            if method == "users.info":
                email = self.emails.get(data["user"], "")
                return {"ok": True, "user": {"id": data["user"], "profile": {"email": email}}}
            return {"ok": False, "error": "unknown_method"}

    def calls_of(self, method: str) -> list[dict]:
        with self._lock:
            return [data for name, data in self.calls if name == method]

    # What Slack sends to Tollgate ------------------------------------------------------

    @staticmethod
    def signed(body: bytes, *, timestamp: int | None = None,
               secret: str = SIGNING_SECRET) -> dict:
        timestamp = int(time.time()) if timestamp is None else timestamp
        base = f"v0:{timestamp}:".encode() + body
        signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature,
                "Content-Type": "application/x-www-form-urlencoded"}

    @staticmethod
    def body(payload: dict) -> bytes:
        return urlencode({"payload": json.dumps(payload)}).encode()

    def send(self, url: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        """POST a request to Tollgate, as Slack does; (status, body)."""
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def press(self, url: str, payload: dict, **signing) -> tuple[int, bytes]:
        body = self.body(payload)
        return self.send(url, body, self.signed(body, **signing))


def who(user_id: str, name: str) -> dict:
    return {"user": {"id": user_id, "username": name, "team_id": TEAM}, "team": {"id": TEAM}}


def shown(gate) -> str:
    """The evidence digest a gate's message shows now (as Tollgate renders it into buttons)."""
    from workflows.models import Step

    return Step.objects.filter(pk=gate.pk).values_list("evidence_digest", flat=True).first()


def button(gate, action: str, user_id: str, name: str, channel: str = "C-QA",
           seen: str | None = None) -> dict:
    """A press of Approve or Reject on a gate's message (as it shows now, or as it showed
    the evidence `seen`)."""
    seen = shown(gate) if seen is None else seen
    return {"type": "block_actions", **who(user_id, name), "trigger_id": f"trig-{time.time()}",
            "channel": {"id": channel},
            "actions": [{"action_id": f"tollgate_{action}", "block_id": "tollgate_decide",
                         "value": f"{gate.pk}:{gate.attempt}:{seen}"}]}


def submission(gate, decision: str, user_id: str, name: str, *, values: dict | None = None,
               comment: str = "", channel: str = "C-QA", seen: str | None = None) -> dict:
    """A submitted modal: each field as Slack reports its element's state."""
    state = {"comment": {"value": {"type": "plain_text_input", "value": comment or None}}}
    for field, value in (values or {}).items():
        if isinstance(value, bool):
            entry = {"type": "checkboxes", "selected_options": [{"value": "true"}] if value
                     else []}
        elif isinstance(value, dict):
            entry = value
        else:
            entry = {"type": "plain_text_input", "value": str(value)}
        state[f"field_{field}"] = {"value": entry}
    return {"type": "view_submission", **who(user_id, name), "view": {
        "callback_id": "tollgate_decide", "state": {"values": state},
        "private_metadata": json.dumps({"s": gate.pk, "a": gate.attempt, "d": decision,
                                        "c": channel,
                                        "e": shown(gate) if seen is None else seen})}}
