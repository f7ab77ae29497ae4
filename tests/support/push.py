"""A Web Push service on 127.0.0.1, as FCM or Mozilla's autopush are to browsers: it keeps
each message posted to an endpoint and answers with the status a test sets; and a browser's
side of a subscription, whose keys decrypt what was pushed (RFC 8291, with http_ece)."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .processes import listener


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


class PushService:
    def __init__(self):
        self.received: list[tuple[str, dict, bytes]] = []
        self.status = 201
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                service.received.append((self.path, {k.lower(): v for k, v in
                                                     self.headers.items()}, body))
                self.send_response(service.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        sock = listener()
        self.server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
        self.server.socket = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Subscriber:
    """A browser's subscription to `service`: its JSON as PushManager gives it, and what
    decrypts the messages sent to it."""

    def __init__(self, service: PushService, name: str = "phone"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        public = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        self.endpoint = f"{service.url}/push/{name}"
        self.info = {"endpoint": self.endpoint, "expirationTime": None,
                     "keys": {"p256dh": b64(public), "auth": b64(self.auth)}}

    def read(self, body: bytes) -> dict:
        return json.loads(http_ece.decrypt(body, private_key=self.key, auth_secret=self.auth,
                                           version="aes128gcm"))


def vapid_claims(headers: dict, public_key: str) -> dict:
    """The claims of a push's VAPID authorization, its signature checked with the key the
    browser subscribed with (RFC 8292: "vapid t=<JWT>, k=<key>"); header names in lower
    case."""
    scheme, _, params = headers["authorization"].partition(" ")
    assert scheme == "vapid", headers["authorization"]
    fields = dict(part.strip().split("=", 1) for part in params.split(","))
    assert fields["k"] == public_key
    point = base64.urlsafe_b64decode(public_key + "=" * (-len(public_key) % 4))
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    return jwt.decode(fields["t"], key=key, algorithms=["ES256"],
                      options={"verify_aud": False})
