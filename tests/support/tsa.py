"""A local RFC 3161 timestamp authority: `openssl ts -reply` behind a small HTTP server, with
a root certificate and a timestamping certificate of its own. `tampered` makes it answer
for other data than it was asked about (an authority that lies, or a man in the middle)."""

from __future__ import annotations

import datetime
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CONFIG = """[ tsa ]
default_tsa = local
[ local ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.crt
certs = $dir/tsa.crt
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.3.6.1.4.1.55555.1
digests = sha256, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def _certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool):
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


class LocalAuthority:
    def __init__(self, directory: Path):
        self.dir = directory
        self.tampered = False
        self.requests = 0
        ca_key, tsa_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
            ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Test TSA root")])
        ca = _certificate("Test TSA root", ca_key, ca_name, ca_key, ca=True)
        tsa = _certificate("Test TSA", tsa_key, ca_name, ca_key, ca=False)
        (directory / "ca.crt").write_bytes(_pem(ca))
        (directory / "tsa.crt").write_bytes(_pem(tsa))
        (directory / "tsa.key").write_bytes(tsa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (directory / "serial").write_text("01\n")
        (directory / "tsa.cnf").write_text(CONFIG.format(dir=directory))
        self.ca_file = str(directory / "ca.crt")
        authority = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                query = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                authority.requests += 1
                answer = authority.reply(query)
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tsr"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reply(self, query: bytes) -> bytes:
        """openssl's answer to a timestamp query (for another digest when tampered)."""
        with self.dir.joinpath("request.tsq").open("wb") as handle:
            handle.write(query)
        source = ["-queryfile", str(self.dir / "request.tsq")]
        if self.tampered:
            source = ["-digest", "00" * 32, "-sha256", "-no_nonce", "-cert"]
            subprocess.run(["openssl", "ts", "-query", *source, "-out",
                            str(self.dir / "forged.tsq")], check=True, capture_output=True)
            source = ["-queryfile", str(self.dir / "forged.tsq")]
        subprocess.run(["openssl", "ts", "-reply", "-config", str(self.dir / "tsa.cnf"),
                        *source, "-out", str(self.dir / "reply.tsr")], check=True,
                       capture_output=True)
        return (self.dir / "reply.tsr").read_bytes()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
