"""SSRF protection for delivery: which addresses are internal, a resolver that refuses names
resolving to one (HTTP), and the checked address a broker connection is pinned to.

The check and the connection must use the same resolution, or a name that answers a public
address to the check and 127.0.0.1 to the connection (DNS rebinding) slips through. So for HTTP
the check lives in the resolver of the connector: aiohttp resolves a name once per connection
through it and connects only to the addresses it returned, with the Host header and the TLS
server name (SNI and certificate check) still the URL's name. A broker dispatcher resolves
its URL's host once with checked_address() and connects to the address that returned, the TLS
server name still the URL's host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from ..outcome import Outcome

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class InternalAddressRefused(Exception):
    """Not an OSError on purpose: aiohttp passes it through unwrapped, so the dispatcher can tell
    it from a failed lookup (retryable) and class it as permanent."""

    def __init__(self, host: str, address: str) -> None:
        super().__init__(f"{host} resolves to internal address {address}")
        self.host = host
        self.address = address


def is_internal(address: IPAddress) -> bool:
    """Loopback, private, link-local (169.254.169.254, the cloud metadata service, among them),
    unique-local, shared, reserved, documentation, multicast or unspecified, also when an IPv6
    address wraps an IPv4 one (mapped, compatible, 6to4, NAT64)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and (address in _NAT64 or address in _IPV4_COMPATIBLE) and int(address) > 1:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_internal(embedded)
    return (not address.is_global or address.is_multicast or address.is_reserved or address.is_link_local
            or address.is_loopback or getattr(address, "is_site_local", False))


def internal_literal(host: str) -> str | None:
    """host itself when it is an internal IP literal (no lookup involved), else None."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return "localhost" if host.rstrip(".").lower() == "localhost" or host.rstrip(".").lower().endswith(
            ".localhost") else None
    return host if is_internal(address) else None


class GuardedResolver(AbstractResolver):
    """Resolves through `resolver` (the threaded getaddrinfo by default) and refuses the whole
    answer when any address in it is internal: a name must not get a connection to an internal
    host by listing a public address first."""

    def __init__(self, resolver: AbstractResolver | None = None) -> None:
        self._resolver = resolver or ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        answers = await self._resolver.resolve(host, port, family)
        for answer in answers:
            address = ipaddress.ip_address(str(answer["host"]).split("%")[0])
            if is_internal(address):
                raise InternalAddressRefused(host, str(address))
        return answers

    async def close(self) -> None:
        await self._resolver.close()


async def checked_address(host: str) -> str:
    """The address to connect to for host: host resolved once, and refused (InternalAddressRefused)
    when it is an internal literal or any address it resolves to is internal. Odd spellings of
    an IPv4 address (127.1, 0x7f.1, 2130706433, 017700000001) resolve to what they mean."""
    literal = internal_literal(host)
    if literal:
        raise InternalAddressRefused(host, literal)
    answers = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses = [str(answer[4][0]).split("%")[0] for answer in answers]
    for address in addresses:
        if is_internal(ipaddress.ip_address(address)):
            raise InternalAddressRefused(host, address)
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    return addresses[0]


def refused(address: str, host: str | None = None) -> Outcome:
    """The outcome of a delivery refused for an internal address, whatever the protocol."""
    via = f" ({host} resolves to it)" if host and host != address else ""
    return Outcome.permanent(f"internal address {address} blocked{via}; set allow_internal on the endpoint "
                             "or http_allow_internal_urls to allow it")
