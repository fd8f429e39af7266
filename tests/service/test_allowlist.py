"""Specification of fleet mode's allowlist: what /probe may reach, and what never."""

from __future__ import annotations

import ipaddress

import pytest

from exporter.service.allowlist import (
    AllowlistError,
    is_allowed,
    parse_allowlist,
    parse_endpoint,
    parse_entry,
    parse_target,
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address from text."""
    return ipaddress.ip_address(text)


def test_a_cidr_entry_allows_literal_addresses_inside_it() -> None:
    """10.0.0.0/8 allows http://10.1.2.3:8000 and refuses 192.168.1.1."""
    allow = parse_allowlist(["10.0.0.0/8"])
    assert is_allowed(parse_target("http://10.1.2.3:8000"), allow) == (True, "allowed")
    assert is_allowed(parse_target("http://192.168.1.1:8000"), allow) == (
        False,
        "not_in_allowlist",
    )


def test_a_name_entry_with_a_wildcard_allows_names_under_the_suffix_only() -> None:
    """*.vllm.svc allows a.vllm.svc but not vllm.svc.evil.com or the bare suffix."""
    allow = parse_allowlist(["*.vllm.svc"])
    assert is_allowed(parse_target("a.vllm.svc:8000"), allow)[0]
    assert not is_allowed(parse_target("vllm.svc.evil.com:8000"), allow)[0]
    assert not is_allowed(parse_target("vllm.svc:8000"), allow)[0]


def test_a_port_in_the_entry_restricts_the_port() -> None:
    """10.0.0.0/8:8000 allows port 8000 only."""
    allow = parse_allowlist(["10.0.0.0/8:8000"])
    assert is_allowed(parse_target("http://10.0.0.5:8000"), allow)[0]
    assert not is_allowed(parse_target("http://10.0.0.5:22"), allow)[0]


def test_a_name_is_allowed_by_networks_only_if_every_address_it_resolves_to_is_inside() -> None:
    """A name resolving into and out of the allowed network is refused (no rebinding trick)."""
    allow = parse_allowlist(["10.0.0.0/8"])
    target = parse_target("http://vllm.example:8000")
    assert is_allowed(target, allow, [ip("10.0.0.7")])[0]
    assert not is_allowed(target, allow, [ip("10.0.0.7"), ip("203.0.113.9")])[0]
    assert not is_allowed(target, allow, [])[0]


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254:80",  # cloud metadata service
        "http://[fe80::1]:8000",  # IPv6 link-local
        "http://224.0.0.1:8000",  # multicast
        "http://0.0.0.0:8000",  # unspecified
    ],
)
def test_metadata_and_other_special_addresses_are_never_probed(target: str) -> None:
    """Even an allow-everything list never reaches link-local, multicast or unspecified."""
    allow = parse_allowlist(["0.0.0.0/0", "::/0"])
    assert is_allowed(parse_target(target), allow) == (False, "forbidden_address")


def test_a_name_resolving_to_the_metadata_address_is_refused() -> None:
    """A friendly name pointing at 169.254.169.254 is refused like the address itself."""
    allow = parse_allowlist(["*.example"])
    target = parse_target("http://metadata.example:80")
    assert is_allowed(target, allow, [ip("169.254.169.254")]) == (False, "forbidden_address")


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("file:///etc/passwd", "scheme"),
        ("gopher://10.0.0.1:70", "scheme"),
        ("http://user:pw@10.0.0.1:8000", "credentials"),
        ("http://10.0.0.1:8000/admin", "path"),
        ("http://10.0.0.1:99999", "port"),
        ("http://:8000", "host"),
        ("http://[::1:8000", "not a URL"),
    ],
)
def test_targets_other_than_plain_http_base_urls_are_rejected(target: str, problem: str) -> None:
    """Other schemes, credentials, paths and bad ports never become a probe."""
    with pytest.raises(AllowlistError, match=problem):
        parse_target(target)


def test_a_target_without_a_scheme_is_http_and_gets_a_default_port() -> None:
    """host:port means http://host:port; https without a port means 443."""
    assert parse_target("10.0.0.1:8000").url == "http://10.0.0.1:8000"
    assert parse_target("https://vllm.example").url == "https://vllm.example:443"


@pytest.mark.parametrize(
    "entry", ["http://10.0.0.1", "10.0.0.0/33", "bad host!", "10.0.0.1:0", "*.*.svc", ""]
)
def test_malformed_entries_are_rejected_with_the_entry_named(entry: str) -> None:
    """A wrong allowlist entry is a configuration error naming the entry."""
    with pytest.raises(AllowlistError):
        parse_entry(entry)


def test_ipv6_entries_with_ports_use_brackets() -> None:
    """[fd00::1]:8000 allows that address on that port."""
    allow = parse_allowlist(["[fd00::1]:8000"])
    assert is_allowed(parse_target("http://[fd00::1]:8000"), allow)[0]
    assert not is_allowed(parse_target("http://[fd00::1]:9000"), allow)[0]


#: Twelve spellings of one target, [::1] on port 80: each must name the same target.
LOOPBACK_V6_SPELLINGS = (
    "[::1]",
    "[::1]:80",
    "http://[::1]",
    "http://[::1]:80/",
    "HTTP://[::1]:080",
    "http://[0:0:0:0:0:0:0:1]",
    "http://[::0001]:80",
    "http://[0::1]",
    "http://[0000:0000::1]",
    "http://[::0:1]:80",
    "http://[0:0::0:0:1]",
    "[0:0:0:0:0:0:0:0001]:80",
)


@pytest.mark.parametrize("spelling", LOOPBACK_V6_SPELLINGS)
def test_every_spelling_of_an_address_is_one_target(spelling: str) -> None:
    """Address forms, case, leading zeros and the default port written or not: one identity."""
    target = parse_target(spelling)
    assert (target.url, target.host, target.port) == ("http://[::1]:80", "::1", 80)


@pytest.mark.parametrize(
    "spelling",
    ["vllm.svc:8000", "VLLM.svc:8000", "http://Vllm.Svc.:8000", "http://vllm.svc.:8000/"],
)
def test_a_name_in_any_case_with_or_without_its_trailing_dot_is_one_target(spelling: str) -> None:
    """``vllm.svc``, ``VLLM.svc`` and ``vllm.svc.`` are one target (DNS names ignore case)."""
    assert parse_target(spelling).url == "http://vllm.svc:8000"


def test_https_default_port_written_or_not_is_one_target() -> None:
    """https://h and https://h:443 are one target; http://h:443 is another (another scheme)."""
    assert parse_target("https://vllm.svc").url == parse_target("https://vllm.svc:443").url
    assert parse_target("http://vllm.svc:443").url == "http://vllm.svc:443"


def test_an_ipv4_mapped_address_is_its_ipv4_target_and_still_never_probed_if_forbidden() -> None:
    """[::ffff:10.0.0.1] is 10.0.0.1; [::ffff:169.254.169.254] is the metadata address."""
    assert parse_target("http://[::ffff:10.0.0.1]:8000").url == "http://10.0.0.1:8000"
    metadata = parse_target("http://[::ffff:169.254.169.254]")
    assert is_allowed(metadata, parse_allowlist(["0.0.0.0/0", "::/0"])) == (
        False,
        "forbidden_address",
    )


def test_an_ipv4_mapped_allowlist_address_allows_its_ipv4_target() -> None:
    """An entry ``::ffff:10.0.0.1`` allows the target 10.0.0.1 (one address, one spelling)."""
    allow = parse_allowlist(["::ffff:10.0.0.1"])
    assert is_allowed(parse_target("10.0.0.1:8000"), allow) == (True, "allowed")


def test_an_address_with_a_zone_is_refused_naming_the_zone() -> None:
    """``[::1%25eth0]`` would be another spelling per zone: refused, saying why."""
    with pytest.raises(AllowlistError, match="has a zone"):
        parse_target("http://[::1%25eth0]:8000")


@pytest.mark.parametrize("port", ["²", "٨٠٠٠", "8\u0660"])
def test_an_entry_port_of_non_ascii_digits_is_refused_not_a_crash(port: str) -> None:
    """Digits Python's int() reads (superscripts, Arabic-Indic) are not ports: a clear error."""
    with pytest.raises(AllowlistError, match="port must be a number"):
        parse_entry(f"10.0.0.1:{port}")


def test_an_endpoint_keeps_its_path_and_is_normalised_like_a_target() -> None:
    """A dcgm-exporter URL: host and port as a target's, the path kept (/metrics by default)."""
    assert parse_endpoint("http://10.0.0.7:9400/metrics").url == "http://10.0.0.7:9400/metrics"
    assert parse_endpoint("HTTP://[::FFFF:10.0.0.7]:9400").url == "http://10.0.0.7:9400/metrics"
    assert parse_endpoint("https://dcgm.node.local/m").url == "https://dcgm.node.local:443/m"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://10.0.0.7/metrics", "http"),
        ("10.0.0.7:9400/metrics", "http"),
        ("http://u:p@10.0.0.7:9400/metrics", "credentials"),
        ("http://10.0.0.7:9400/metrics?x=1", "query"),
        ("http://10.0.0.7:9400/../admin", "path"),
        ("http://10.0.0.7:9400/m%65trics", "path"),
        ("http://10.0.0.7:9400/" + "m" * 300, "path"),
        ("http://127.1:9400/metrics", "non-standard"),
        ("http://10.0.0.7:0/metrics", "port"),
        ("http://[::1/metrics", "not a URL"),
    ],
)
def test_an_endpoint_other_than_a_plain_http_url_is_rejected_naming_why(
    url: str, problem: str
) -> None:
    """What a probe parameter may not be: another scheme, credentials, a query, an odd path."""
    with pytest.raises(AllowlistError, match=problem):
        parse_endpoint(url)


@pytest.mark.parametrize(
    "target",
    [
        "http://[fd00:ec2::254]:80",  # AWS instance metadata service (IPv6 endpoint)
        "http://[fd00:ec2:0:0::254]:80",  # the same, spelt longer
        "http://[fd00:ec2::23]:80",  # AWS EKS Pod Identity agent
        "http://[fd20:ce::254]:80",  # Google Cloud metadata server (IPv6-only VMs)
        "http://[fd00:c1::a9fe:a9fe]:80",  # Oracle Cloud instance metadata
        "http://[64:ff9b:1::a9fe:a9fe]:80",  # local-use NAT64 (RFC 8215), /96: 169.254.169.254
        "http://[64:ff9b:1:a9fe:a9:fe00::]:80",  # local-use NAT64, /48 layout
        "http://[64:ff9b:1:a9:fe:a9fe::]:80",  # local-use NAT64, /56 layout
        "http://[64:ff9b:1:0:a9:fea9:fe00:0]:80",  # local-use NAT64, /64 layout
    ],
)
def test_ipv6_cloud_metadata_addresses_are_never_probed(target: str) -> None:
    """Unique-local metadata endpoints and local-use NAT64 forms: refused even by ::/0."""
    allow = parse_allowlist(["0.0.0.0/0", "::/0", "fd00::/8"])
    assert is_allowed(parse_target(target), allow) == (False, "forbidden_address")
    endpoint = parse_endpoint(f"{target}/metrics")  # a dcgm URL is checked alike
    assert is_allowed(endpoint, allow) == (False, "forbidden_address")


@pytest.mark.parametrize(
    "target",
    [
        "http://[fd00:ec2::1]:8000",
        "http://[64:ff9b:1::a00:5]:8000",  # 10.0.0.5 behind a /96 local-use NAT64
        "http://[fd20:ce::1]:8000",
        # Pods whose address, read at another layout's place, looks multicast or the like:
        "http://[64:ff9b:1:0:a:102:e600:0]:8000",  # 10.1.2.230, /64 (230.0.0.0 at the /96 place)
        "http://[64:ff9b:1:0:c0:a801:e000:0]:8000",  # 192.168.1.224, /64
        "http://[64:ff9b:1:a:e6:102::]:8000",  # 10.230.1.2, /56
        "http://[64:ff9b:1:a00:e0:900::]:8000",  # 10.0.224.9, /48
    ],
)
def test_neighbours_of_the_metadata_addresses_stay_probeable(target: str) -> None:
    """A vLLM at another ULA address, or behind local-use NAT64 at any layout, is allowed."""
    allow = parse_allowlist(["::/0"])
    assert is_allowed(parse_target(target), allow) == (True, "allowed")


def test_a_name_resolving_to_an_ipv6_metadata_address_is_refused() -> None:
    """A friendly name pointing at fd00:ec2::254 is refused like the address itself."""
    allow = parse_allowlist(["*.example"])
    target = parse_target("http://metadata.example:80")
    assert is_allowed(target, allow, [ip("fd00:ec2::254")]) == (False, "forbidden_address")
