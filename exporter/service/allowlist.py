"""Target URLs checked and shown safely, and which targets ``/probe`` may reach.

A target's host is a DNS name or a literal address in its one canonical form: a name whose
last label is numeric (``0177.0.0.1``, ``127.1``, ``2130706433``) is refused, because resolvers
read such names as IPv4 addresses in octal, shorthand or decimal, and a port is 1 to 65535
(``:0`` is not "the default"). :func:`redact_url` hides a password before a URL is logged or
shown. The fleet mode's allowlist keeps ``/probe`` from being an open proxy:

Entries (pure parsing and matching; name resolution is the caller's I/O):

- ``10.0.0.0/8``, ``fd00::/8``: any target whose address (literal, or every address its name
  resolves to) lies in the network.
- ``10.1.2.3``, ``::1``: that address.
- ``vllm.prod.svc.cluster.local``, ``*.prod.svc.cluster.local``: that host name, or any name
  under the suffix (``*.`` matches one or more labels).
- any of the above with ``:PORT`` (IPv6 in brackets, ``[::1]:8000``): only that port.

Some addresses are never probed, whatever the allowlist says (targets and dcgm URLs alike):
link-local ones (the cloud metadata service at ``169.254.169.254`` among them), multicast,
unspecified and broadcast; the cloud metadata services that answer on unique-local IPv6
addresses instead, which ``fd00::/8`` entries would otherwise admit: AWS's instance metadata
service at ``fd00:ec2::254`` (and its EKS Pod Identity agent at ``fd00:ec2::23``), Google
Cloud's metadata server at ``fd20:ce::254`` (IPv6-only VMs) and Oracle Cloud's at
``fd00:c1::a9fe:a9fe``; and IPv6 forms of a forbidden IPv4 address: IPv4-mapped
(``::ffff:169.254.169.254``), the well-known NAT64 prefix ``64:ff9b::/96`` (RFC 6052) and the
local-use NAT64 prefix ``64:ff9b:1::/48`` (RFC 8215), refused when any place RFC 6052 lets a
network of that prefix embed the address reads as a link-local one (the metadata services; not
for multicast and the like, as a pod's address read at another place than its network's can
look like anything). Only ``http`` and ``https`` URLs are probed.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from urllib.parse import SplitResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AllowlistError(ValueError):
    """An allowlist entry that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One parsed allowlist entry: a network or a host pattern, and an optional port."""

    network: IPNetwork | None = None
    host: str | None = None
    port: int | None = None

    def matches_name(self, host: str, port: int) -> bool:
        """Whether a host name (not an address) and port match this entry's name pattern."""
        if self.host is None or (self.port is not None and self.port != port):
            return False
        host = host.lower().rstrip(".")
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def matches_address(self, address: IPAddress, port: int) -> bool:
        """Whether an address and port lie in this entry's network."""
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return address.version == self.network.version and address in self.network


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise AllowlistError(f"entry {entry!r}: expected [IPv6]:PORT")
        return host, _port(entry, rest[1:]) if rest else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65_536:
        raise AllowlistError(f"entry {entry!r}: port must be a number from 1 to 65535")
    return int(text)


_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


def parse_entry(entry: str) -> AllowEntry:
    """Parse one allowlist entry; :class:`AllowlistError` names what is wrong with it."""
    text = entry.strip()
    if not text:
        raise AllowlistError("empty entry")
    if "://" in text:
        raise AllowlistError(f"entry {entry!r}: give a host, IP or CIDR without a scheme")
    host, port = _split_port(text)
    if "/" in host:
        try:
            return AllowEntry(network=ipaddress.ip_network(host, strict=False), port=port)
        except ValueError:
            raise AllowlistError(f"entry {entry!r}: not a valid CIDR network") from None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return AllowEntry(network=ipaddress.ip_network(canonical_address(address)), port=port)
    name = host.lower().rstrip(".")
    bare = name.removeprefix("*.")
    if not bare or not set(bare) <= _HOST_CHARS or "*" in bare or ".." in bare:
        raise AllowlistError(
            f"entry {entry!r}: not a host name, *.suffix pattern, IP address or CIDR network"
        )
    return AllowEntry(host=name, port=port)


def parse_allowlist(entries: Iterable[str]) -> tuple[AllowEntry, ...]:
    """Parse every entry; the first bad one raises :class:`AllowlistError`."""
    return tuple(parse_entry(entry) for entry in entries)


#: The well-known NAT64 prefix (RFC 6052): ``64:ff9b::a9fe:a9fe`` reaches ``169.254.169.254``.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: The local-use NAT64 prefix (RFC 8215): a network picks a prefix of 48 to 96 bits within it,
#: and the IPv4 address sits where RFC 6052 puts it for that length (bits 64 to 71 are skipped).
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
#: Where the IPv4 address is in a NAT64 address, by the prefix lengths possible within
#: ``64:ff9b:1::/48``: the bit offsets (from the right) of its parts, high part first.
_NAT64_LOCAL_PLACES = (
    ((64, 16), (40, 16)),  # /48: bits 48-63, then 72-87
    ((64, 8), (32, 24)),  # /56: bits 56-63, then 72-95
    ((24, 32),),  # /64: bits 72-103
    ((0, 32),),  # /96: the last 32 bits
)
#: Cloud metadata services on unique-local IPv6 addresses (not link-local, so Python's
#: ``is_link_local`` misses them): AWS's (IMDS, EKS Pod Identity), Google Cloud's, Oracle's.
_METADATA_V6 = frozenset(
    ipaddress.IPv6Address(text)
    for text in ("fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254", "fd00:c1::a9fe:a9fe")
)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches: IPv4-mapped (``::ffff:a.b.c.d``) or NAT64."""
    found = embedded_ipv4s(address)
    return found[0] if found else None


def embedded_ipv4s(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """Every IPv4 address an IPv6 address may reach (IPv4-mapped, NAT64); none for others.

    One for IPv4-mapped and ``64:ff9b::/96`` addresses; for ``64:ff9b:1::/48`` one for each
    prefix length its network may use (the address does not say which), but none in
    ``0.0.0.0/8``: the zero bits of another layout read so.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    if address.ipv4_mapped is not None:
        return (address.ipv4_mapped,)
    if address in _NAT64:
        return (ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF),)
    if address in _NAT64_LOCAL:
        value = int(address)
        found = []
        for places in _NAT64_LOCAL_PLACES:
            number = 0
            for shift, bits in places:
                number = (number << bits) | ((value >> shift) & ((1 << bits) - 1))
            # 0.0.0.0/8 is what the zero bits of another layout read as; no NAT64 reaches it.
            if number >> 24:
                found.append(ipaddress.IPv4Address(number))
        return tuple(dict.fromkeys(found))
    return ()


def never_probed(address: IPAddress) -> bool:
    """Addresses refused whatever the allowlist says (metadata services, multicast...).

    IPv6 forms of an IPv4 address (``[::ffff:169.254.169.254]``, NAT64) are judged by the IPv4
    addresses they may reach: Python's ``is_link_local`` does not look inside them.
    """
    inner = embedded_ipv4(address)
    if inner is not None and address not in _NAT64_LOCAL and never_probed(inner):
        return True
    # A local-use NAT64 address may be read at several places, and the bytes of a pod's address
    # read at another place can look like anything (10.1.2.230 behind a /64 prefix reads as
    # 230.0.0.0 at the /96 place): refused only when some place reads a link-local address, the
    # metadata services', so that ordinary pods stay reachable.
    if address in _NAT64_LOCAL and any(r.is_link_local for r in embedded_ipv4s(address)):
        return True
    return (
        address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address in _METADATA_V6
        or (
            isinstance(address, ipaddress.IPv4Address)
            and address == ipaddress.IPv4Address("255.255.255.255")
        )
    )


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """A target URL taken apart: scheme, host (name or address), port, and the normalised URL."""

    scheme: str
    host: str
    port: int
    url: str

    @property
    def address(self) -> IPAddress | None:
        """The host as an IP address, when it is a literal one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def canonical_address(address: IPAddress) -> IPAddress:
    """The address itself, or the IPv4 address an IPv4-mapped one (``::ffff:a.b.c.d``) reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def canonical_host(host: str) -> str:
    """A checked host (:func:`check_host`) in the one form that names its target.

    Every spelling of an address is the same target (``[0:0:0:0:0:0:0:1]``, ``[::0001]`` and
    ``[::1]``; ``[::ffff:127.0.0.1]`` and ``127.0.0.1``), and so is a name with or without its
    trailing dot, in any case. A zone (``[fe80::1%eth0]``) is refused: it only matters for
    link-local addresses, which are never probed, and each zone would be another spelling.
    """
    text = check_host(host)
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text.rstrip(".")
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        msg = f"{host!r} has a zone (%...); give the address without it"
        raise AllowlistError(msg)
    return str(canonical_address(address))


def check_host(host: str) -> str:
    """``host`` lower-cased if it is a literal address or a host name; else AllowlistError."""
    text = host.lower()
    try:
        ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        return text
    labels = text.rstrip(".").split(".")
    if (
        not text
        or len(text) > 253
        or not all(
            label and len(label) <= 63 and set(label) <= _LABEL_CHARS and label[0] != "-"
            for label in labels
        )
    ):
        msg = f"{host!r} is not a host name or an IP address"
        raise AllowlistError(msg)
    if labels[-1].isdigit() or labels[-1].startswith("0x"):
        msg = (
            f"{host!r} looks like an IPv4 address in a non-standard form (octal, hexadecimal "
            "or shorthand); write it as four decimal numbers, like 127.0.0.1"
        )
        raise AllowlistError(msg)
    return text


_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


def target_port(parts: SplitResult) -> int | None:
    """The explicit port of a URL (None when it has none); AllowlistError when out of range."""
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65_536:
        msg = "the port must be a number from 1 to 65535"
        raise AllowlistError(msg)
    return port


def check_url(url: str, *, paths: bool = True) -> str:
    """An ``http(s)://host[:port][/path]`` URL checked; AllowlistError naming what is wrong.

    Credentials (``user:password@``) are allowed: vLLM behind a proxy may need Basic auth.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        msg = "must be an http:// or https:// URL with a host, like http://127.0.0.1:8000"
        raise AllowlistError(msg)
    if not parts.hostname:
        msg = "has no host; give one, like http://127.0.0.1:8000"
        raise AllowlistError(msg)
    check_host(parts.hostname)
    target_port(parts)
    if parts.query or parts.fragment or (not paths and parts.path not in ("", "/")):
        msg = "must be a base URL (scheme://host:port), without a query"
        raise AllowlistError(msg)
    return url.strip().rstrip("/")


def redact_url(url: str) -> str:
    """``url`` with the password of its credentials replaced, safe to log and to show."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def parse_target(target: str) -> ProbeTarget:
    """Parse ``/probe``'s ``target`` (``http(s)://host:port`` or ``host:port``), normalised.

    Its ``url`` is the target's one identity, whatever the spelling (:func:`canonical_host`,
    the scheme's default port written out): limits, windows and the token apply to it.

    :class:`AllowlistError` for other schemes, user info, paths beyond ``/`` or a bad port.
    """
    text = target.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed [IPv6
        raise AllowlistError("the target is not a URL") from None
    if parts.scheme not in ("http", "https"):
        raise AllowlistError(f"scheme {parts.scheme!r} is not allowed; use http or https")
    if parts.username or parts.password:
        raise AllowlistError("credentials in the target URL are not allowed")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise AllowlistError("the target must be a base URL (scheme://host:port), without a path")
    if not parts.hostname:
        raise AllowlistError("the target has no host")
    host = canonical_host(parts.hostname)
    port = target_port(parts) or (443 if parts.scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    return ProbeTarget(parts.scheme, host, port, f"{parts.scheme}://{shown}:{port}")


#: Characters of an endpoint's path (:func:`parse_endpoint`): what metrics paths are made of.
_PATH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/")
#: Longest path of an endpoint.
MAX_PATH_CHARS = 256


def parse_endpoint(url: str) -> ProbeTarget:
    """Parse a probe parameter naming an HTTP endpoint (``http(s)://host:port/path``), normalised.

    Checked as :func:`parse_target` checks a target (host, port, no credentials, no query), and
    its path limited to plain characters: it is chosen by whoever can reach ``/probe``. The
    ``url`` keeps the path (``/metrics`` when none is given). :class:`AllowlistError` says
    what is wrong.
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # an unclosed [IPv6
        raise AllowlistError("is not a URL") from None
    if parts.scheme not in ("http", "https"):
        raise AllowlistError(
            "must be an http:// or https:// URL, like http://10.0.0.7:9400/metrics"
        )
    if parts.username or parts.password:
        raise AllowlistError("credentials in the URL are not allowed")
    if parts.query or parts.fragment:
        raise AllowlistError("must have no query or fragment")
    path = parts.path or "/metrics"
    if len(path) > MAX_PATH_CHARS or not set(path) <= _PATH_CHARS or ".." in path:
        raise AllowlistError(
            f"the path must be at most {MAX_PATH_CHARS} plain characters "
            "(letters, digits, -._~/), without '..'"
        )
    if not parts.hostname:
        raise AllowlistError("has no host")
    host = canonical_host(parts.hostname)
    port = target_port(parts) or (443 if parts.scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    return ProbeTarget(parts.scheme, host, port, f"{parts.scheme}://{shown}:{port}{path}")


def is_allowed(
    target: ProbeTarget,
    allowlist: Sequence[AllowEntry],
    resolved: Sequence[IPAddress] = (),
) -> tuple[bool, str]:
    """Decide whether ``target`` may be probed: ``(allowed, reason)``.

    ``resolved`` are the addresses the target's host name resolves to (the caller resolves;
    empty for literal addresses). A name is allowed when a name entry matches it, or when every
    address it resolves to is inside an allowed network. ``reason`` is a bounded label value:
    ``allowed``, ``forbidden_address`` or ``not_in_allowlist``.
    """
    literal = target.address
    addresses = [literal] if literal is not None else list(resolved)
    if any(never_probed(a) for a in addresses):
        return False, "forbidden_address"
    if literal is None and any(e.matches_name(target.host, target.port) for e in allowlist):
        return True, "allowed"
    if addresses and all(
        any(e.matches_address(a, target.port) for e in allowlist) for a in addresses
    ):
        return True, "allowed"
    return False, "not_in_allowlist"
