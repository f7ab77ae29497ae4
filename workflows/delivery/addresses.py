"""Where Tollgate may post (webhooks, and the push services of people's browsers): URLs
checked at save and again, after DNS, at send time.

A webhook URL is `https`, or `http` to a host in TOLLGATE_WEBHOOK_HTTP_HOSTS; it carries no
credentials; and it may not reach loopback, link-local, private or other special addresses
unless TOLLGATE_WEBHOOK_ALLOW_PRIVATE is set. The sender connects to the address it checked,
so a name that resolves differently a moment later (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings


class RefusedAddress(ValueError):
    """A URL Tollgate will not post to; the message says why."""


def check_url(url: str) -> tuple[str, int]:
    """(host, port) of an acceptable webhook URL, checked without DNS; else RefusedAddress."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedAddress(f"not a URL ({exc})") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host:
        raise RefusedAddress("must be an https:// URL")
    if parts.scheme == "http" and host not in settings.TOLLGATE_WEBHOOK_HTTP_HOSTS:
        raise RefusedAddress("must be https (http only to hosts in "
                             "TOLLGATE_WEBHOOK_HTTP_HOSTS)")
    if parts.username is not None or parts.password is not None:
        raise RefusedAddress("must not carry credentials; the signature authenticates posts")
    try:
        check_address(ipaddress.ip_address(host))
    except ValueError as exc:
        if isinstance(exc, RefusedAddress):
            raise
        if host == "localhost" or host.endswith(".localhost"):
            check_address(ipaddress.ip_address("127.0.0.1"))
    return host, port or (443 if parts.scheme == "https" else 80)


NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def embedded_ipv4(address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and reaches: mapped (::ffff:a.b.c.d),
    compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 and Teredo."""
    if address.version != 6:
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    value = int(address)
    if (value >> 32 == 0 and value > 1) or any(address in net for net in NAT64):
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


def check_address(address) -> None:
    if settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE:
        return
    inner = embedded_ipv4(address)
    for each in (address, inner) if inner else (address,):
        if not each.is_global or each.is_multicast:
            raise RefusedAddress(f"{address} is a loopback, link-local, private or reserved "
                                 "address (TOLLGATE_WEBHOOK_ALLOW_PRIVATE allows them)")


def resolve(url: str) -> tuple[str, int, str]:
    """(host, port, the one checked address to connect to) for a URL; RefusedAddress if the
    URL, or any address its host resolves to, is refused."""
    host, port = check_url(url)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise RefusedAddress(f"{host} does not resolve") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    for address in addresses:
        check_address(address)
    return host, port, str(addresses[0])


class PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the address that was checked, whatever the name resolves to now."""

    def __init__(self, host, port, address, **kwargs):
        super().__init__(host, port, **kwargs)
        self.address = address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, address, **kwargs):
        super().__init__(host, port, context=ssl.create_default_context(), **kwargs)
        self.address = address

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


@dataclass
class Answer:
    """What answered a post: read as a `requests` response is (pywebpush reads these)."""

    status_code: int
    reason: str = ""
    text: str = ""
    headers: dict = field(default_factory=dict)


def post(url: str, body: bytes, headers: dict, timeout: float) -> Answer:
    """POST to the address checked for the URL's host (no redirects followed). RefusedAddress
    for a URL that may not be reached; OSError or HTTPException when nothing answered."""
    host, port, address = resolve(url)
    parts = urlsplit(url)
    kind = PinnedHTTPSConnection if parts.scheme == "https" else PinnedHTTPConnection
    connection = kind(host, port, address, timeout=timeout)
    try:
        connection.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query
                                                          else ""), body=body, headers=headers)
        response = connection.getresponse()
        text = response.read(10_000).decode("utf-8", "replace")
        return Answer(response.status, response.reason, text, dict(response.getheaders()))
    finally:
        connection.close()


class PinnedSession:
    """A `requests` session's `post`, as pywebpush sends through one, over `post`: a push
    service's address is checked and connected to as a webhook's is."""

    def post(self, url: str, data=None, headers=None, timeout=None) -> Answer:
        return post(url, data or b"", dict(headers or {}), timeout or 10)
