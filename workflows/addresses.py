"""Where Tollgate may post: webhook URLs checked at save and again, after DNS, at send time.

A webhook URL is `https`, or `http` to a host in TOLLGATE_WEBHOOK_HTTP_HOSTS; it carries no
credentials; and it may not reach loopback, link-local, private or other special addresses
unless TOLLGATE_WEBHOOK_ALLOW_PRIVATE is set. The sender connects to the address it checked,
so a name that resolves differently a moment later (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
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


def check_address(address) -> None:
    if settings.TOLLGATE_WEBHOOK_ALLOW_PRIVATE:
        return
    if not address.is_global or address.is_multicast:
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
