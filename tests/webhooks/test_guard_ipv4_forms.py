"""The SSRF guard judges every IPv6 form that carries an IPv4 address by the IPv4 address it
reaches: IPv4-compatible ``::a.b.c.d`` (RFC 4291 §2.5.5.1) and SIIT ``::ffff:0:a.b.c.d``
(RFC 2765 §2.1) as well as mapped, NAT64, 6to4 and Teredo."""

from __future__ import annotations

import ipaddress

import pytest

from curvplan_core.webhooks.guard import AddressPolicy, WebhookRefused

REFUSING = AddressPolicy.from_lists(["*"], [])


@pytest.mark.parametrize(
    ("address", "reaches"),
    [
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible (deprecated, still routed by some stacks)
        ("::169.254.169.254", "169.254.169.254"),
        ("::10.0.0.1", "10.0.0.1"),
        ("::ffff:0:127.0.0.1", "127.0.0.1"),  # SIIT IPv4-translated
        ("::ffff:0:169.254.169.254", "169.254.169.254"),
        ("::ffff:0:192.168.1.1", "192.168.1.1"),
    ],
)
def test_ipv4_compatible_and_siit_addresses_are_judged_by_their_ipv4(
    address: str, reaches: str
) -> None:
    ip = ipaddress.ip_address(address)
    with pytest.raises(WebhookRefused, match=f"reaches {reaches}"):
        REFUSING.check_address(ip)
    with pytest.raises(WebhookRefused, match="loopback"):  # a literal in the URL too
        REFUSING.check_url(f"http://[{address}]/hook")
    AddressPolicy.from_lists(["*"], [f"{reaches}/32"]).check_address(ip)


def test_public_ipv4_behind_the_compatible_forms_passes() -> None:
    for address in ("::93.184.215.14", "::ffff:0:93.184.215.14"):
        REFUSING.check_address(ipaddress.ip_address(address))


def test_other_addresses_of_the_compatible_range_are_refused() -> None:
    for address in ("::2", "::0.0.0.255"):  # they reach 0.0.0.0/8, "this network"
        with pytest.raises(WebhookRefused):
            REFUSING.check_address(ipaddress.ip_address(address))
