"""Where a webhook may go: the operator's host allow-list and the address policy.

Checked twice: when a job names a ``webhook_url`` (the host must be allowed) and at every
delivery, on the addresses the host resolves to *then* (a name that resolved to a public
address at submission may resolve to 127.0.0.1 later: DNS rebinding). The connection is
made to the address that was checked, never to a second resolution. Loopback, link-local
(which holds the cloud metadata service 169.254.169.254), private, shared, multicast and
reserved addresses are refused unless the operator lists their network explicitly.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Not globally routable, or the metadata services of the big clouds: refused by default.
BLOCKED_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local; 169.254.169.254 is the metadata service
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "64:ff9b:1::/48",  # RFC 8215 local-use NAT64: a site's own translators, any layout
    )
)


#: IPv6 prefixes whose last 32 bits are an IPv4 address the packet reaches: RFC 6052's
#: well-known NAT64 prefix, IPv4-compatible addresses (RFC 4291 §2.5.5.1, deprecated but
#: still routed by some stacks; ``::`` and ``::1`` are refused on their own) and SIIT's
#: IPv4-translated addresses (RFC 2765 §2.1, ``::ffff:0:a.b.c.d``).
IPV4_IN_LOW_BITS: tuple[ipaddress.IPv6Network, ...] = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
)


def embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address delivers to: NAT64 (RFC 6052 ``64:ff9b::/96``),
    IPv4-compatible (RFC 4291 ``::a.b.c.d``), SIIT (RFC 2765 ``::ffff:0:a.b.c.d``), 6to4
    (RFC 3056, ``2002:AABB:CCDD::/48``), Teredo (RFC 4380, the server and the client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found: list[ipaddress.IPv4Address] = []
    if any(address in network for network in IPV4_IN_LOW_BITS):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


class WebhookRefused(ValueError):
    """The URL or the address it resolves to is not allowed."""


MAX_HOST_LENGTH = 253  # RFC 1035 §2.3.4, without the root dot


def _check_encodable(host: str) -> None:
    """Refuse a host that is no DNS name: empty, a label over 63 octets, over 253 in all, or
    not encodable as IDNA (the resolver would raise ``UnicodeError`` at each delivery)."""
    if not host:
        raise WebhookRefused("the webhook URL has no host")
    try:
        encoded = host.encode("idna")
    except UnicodeError as exc:
        raise WebhookRefused(
            f"the webhook host is not a valid DNS name (labels of 1 to 63 characters): {exc}"
        ) from None
    if len(encoded.rstrip(b".")) > MAX_HOST_LENGTH:
        raise WebhookRefused(f"the webhook host is longer than {MAX_HOST_LENGTH} characters")


def host_allowed(host: str, allowed_hosts: Iterable[str]) -> bool:
    """``host`` matches an entry: exact (case-insensitive), '*.domain' (subdomains), '*'."""
    host = host.lower().rstrip(".")
    for pattern in allowed_hosts:
        pattern = pattern.lower().strip().rstrip(".")
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False


def _refuse_if_blocked(address: IPAddress, via: IPAddress | None = None) -> None:
    blocked = any(address in n for n in BLOCKED_NETWORKS if n.version == address.version)
    if blocked or not address.is_global:
        shown = f"{via}, which reaches {address}," if via is not None else f"{address},"
        raise WebhookRefused(
            f"the webhook host resolves to {shown} a loopback, link-local, private or "
            "reserved address (allow its network in CURVPLAN_WEBHOOK_ALLOWED_NETWORKS)"
        )


@dataclass(frozen=True)
class AddressPolicy:
    allowed_hosts: tuple[str, ...] = ()
    allowed_networks: tuple[IPNetwork, ...] = field(default_factory=tuple)

    @classmethod
    def from_lists(cls, hosts: Iterable[str], networks: Iterable[str]) -> AddressPolicy:
        return cls(tuple(hosts), tuple(ipaddress.ip_network(n, strict=False) for n in networks))

    def check_url(self, url: str) -> tuple[str, str, int]:
        """(scheme, host, port) of an allowed URL; raises WebhookRefused otherwise."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise WebhookRefused("the webhook URL must be http:// or https://")
        if parts.username or parts.password:
            raise WebhookRefused("the webhook URL must not carry credentials")
        host = parts.hostname or ""
        _check_encodable(host)
        if not self.allowed_hosts:
            raise WebhookRefused(
                "webhooks are off on this service: the operator lists callback hosts in "
                "CURVPLAN_WEBHOOK_ALLOWED_HOSTS"
            )
        if not host_allowed(host, self.allowed_hosts):
            raise WebhookRefused(f"the host {host!r} is not on the webhook allow-list")
        try:  # a literal address is checked now too
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            self.check_address(literal)
        return parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80)

    def check_address(self, address: IPAddress) -> None:
        """Raise WebhookRefused for a non-public address outside the allowed networks.

        An IPv6 address that carries an IPv4 one (mapped, IPv4-compatible, SIIT, NAT64, 6to4,
        Teredo) is judged by the IPv4 address it reaches as well: ``64:ff9b::7f00:1`` is
        127.0.0.1 behind a NAT64 gateway.
        """
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if self._allowed(address):
            return
        embedded = embedded_ipv4(address)
        for ipv4 in embedded:  # a translation prefix: where it leads decides
            if not self._allowed(ipv4):
                _refuse_if_blocked(ipv4, via=address)
        if not embedded:
            _refuse_if_blocked(address)

    def _allowed(self, address: IPAddress) -> bool:
        return any(address in n for n in self.allowed_networks if n.version == address.version)

    def connect(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """``socket.create_connection`` that resolves once, checks every address the name
        resolves to, and connects to a checked one (used for each delivery)."""
        host, port = address
        _check_encodable(host)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except UnicodeError as exc:  # the resolver's IDNA encoding of the name
            raise WebhookRefused(f"the webhook host cannot be resolved: {exc}") from None
        except socket.gaierror as exc:
            raise WebhookRefused(f"the webhook host {host!r} does not resolve: {exc}") from None
        resolved = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        for ip in resolved:  # one bad address refuses the host: no choosing among them
            self.check_address(ip)
        last: OSError | None = None
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source_address is not None:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last or OSError(f"could not connect to {host}:{port}")
