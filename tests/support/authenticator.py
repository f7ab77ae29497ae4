"""A WebAuthn authenticator in software (an ES256 key, "none" attestation, user present and
verified): it answers the options Tollgate sends as a browser with a passkey would, so the
server's checks can be driven from the Django test client. The browser tests use Chromium's
own virtual authenticator instead."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(self, origin: str = "http://testserver"):
        self.origin = origin
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(16)
        self.count = 0

    def _client_data(self, kind: str, challenge: str) -> bytes:
        return json.dumps({"type": kind, "challenge": challenge, "origin": self.origin,
                           "crossOrigin": False}).encode()

    def _auth_data(self, rp_id: str, flags: int, attested: bytes = b"") -> bytes:
        self.count += 1
        return (hashlib.sha256(rp_id.encode()).digest() + bytes([flags])
                + struct.pack(">I", self.count) + attested)

    def create(self, options: dict) -> str:
        """The answer to navigator.credentials.create, as JSON (PublicKeyCredential.toJSON)."""
        numbers = self.key.public_key().public_numbers()
        cose = cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"),
                            -3: numbers.y.to_bytes(32, "big")})
        attested = (bytes(16) + struct.pack(">H", len(self.credential_id))
                    + self.credential_id + cose)
        auth_data = self._auth_data(options["rp"]["id"], 0x45, attested)  # UP, UV, AT
        client_data = self._client_data("webauthn.create", options["challenge"])
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return json.dumps({
            "id": b64(self.credential_id), "rawId": b64(self.credential_id),
            "type": "public-key", "clientExtensionResults": {},
            "response": {"clientDataJSON": b64(client_data),
                         "attestationObject": b64(attestation), "transports": ["internal"]}})

    def get(self, options: dict) -> str:
        """The answer to navigator.credentials.get (an assertion), as JSON."""
        auth_data = self._auth_data(options["rpId"], 0x05)  # UP, UV
        client_data = self._client_data("webauthn.get", options["challenge"])
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(),
                                  ec.ECDSA(hashes.SHA256()))
        return json.dumps({
            "id": b64(self.credential_id), "rawId": b64(self.credential_id),
            "type": "public-key", "clientExtensionResults": {},
            "response": {"clientDataJSON": b64(client_data), "authenticatorData": b64(auth_data),
                         "signature": b64(signature), "userHandle": None}})
