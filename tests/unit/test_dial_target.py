"""kestrel_sdk.tls.dial_target: one address dials as given; a list of replicas or a DNS
name balances calls round robin (issue 49: several replicas behind one setting)."""

from __future__ import annotations

import pytest

from kestrel_sdk.tls import dial_target

ROUND_ROBIN = ("grpc.lb_policy_name", "round_robin")


@pytest.mark.parametrize(("address", "target", "balanced"), [
    ("127.0.0.1:50052", "127.0.0.1:50052", False),
    ("admission:50052", "admission:50052", False),
    ("dns:///admission-headless:50052", "dns:///admission-headless:50052", True),
    ("127.0.0.1:1,127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2", True),
    (" 127.0.0.1:1 , 127.0.0.1:2 ", "ipv4:127.0.0.1:1,127.0.0.1:2", True),
    ("[::1]:1,[::1]:2", "ipv6:[::1]:1,[::1]:2", True),
], ids=["one-address", "one-name", "a-dns-name", "a-list", "a-list-with-spaces",
        "an-ipv6-list"])
def test_an_address_dials_its_replicas(address: str, target: str, balanced: bool) -> None:
    got, options = dial_target(address)
    assert got == target
    assert (ROUND_ROBIN in options) is balanced


@pytest.mark.parametrize(("address", "why"), [
    ("admission-a:1,admission-b:2", "takes IP addresses"),
    ("127.0.0.1:1,127.0.0.1", "is not ip:port"),
    ("127.0.0.1:1,[::1]:2", "mix IPv4 and IPv6"),
], ids=["names-in-a-list", "a-missing-port", "mixed-families"])
def test_a_list_that_cannot_be_dialled_is_refused_with_why(address: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        dial_target(address)
