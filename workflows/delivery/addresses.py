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
