"""The SSRF guard's rules (docs/http-targets.md): which addresses an HTTP target may reach.

Pure: the worker resolves a host once, asks ``Guard.refusal`` about every address it resolved
to, and connects only to the addresses that passed (rsched.engine.worker.http_target).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from rsched.core.errors import ValidationError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Refused unless allowed: (network, the rule's name as a refusal says it).
BLOCKED: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), rule) for net, rule in (
        ("0.0.0.0/8", "unspecified"), ("10.0.0.0/8", "private"), ("100.64.0.0/10", "private"),
        ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"), ("192.168.0.0/16", "private"),
        ("224.0.0.0/4", "multicast"), ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"), ("::1/128", "loopback"), ("fe80::/10", "link-local"),
        ("fc00::/7", "unique-local"), ("ff00::/8", "multicast")))


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of RSCHED_HTTP_ALLOW or RSCHED_HTTP_DENY: a CIDR, an address or a host name,
    with an optional port (``127.0.0.1:8080``, ``hooks.internal:443``; none: any port)."""

    text: str
    network: Network | None = None
    host: str | None = None
    port: int | None = None

    def matches(self, host: str, address: Address, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return address in self.network
        return self.host == host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class Guard:
    """The rules in force: deny first, then allow, then BLOCKED."""

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = field(default=())

    @classmethod
    def of(cls, allow: str | None, deny: str | None) -> Guard:
        """From the two variables' text (comma lists); ValidationError naming the variable."""
        return cls(parse_rules(allow, "RSCHED_HTTP_ALLOW"), parse_rules(deny, "RSCHED_HTTP_DENY"))

    def refusal(self, host: str, address: Address, port: int) -> str | None:
        """Why ``address`` (which ``host`` resolved to) may not be reached on ``port``, or None.
        An IPv4-mapped IPv6 address is judged as the IPv4 address it holds."""
        mapped = getattr(address, "ipv4_mapped", None)
        plain: Address = mapped if mapped is not None else address
        shown = address if mapped is None else f"::ffff:{mapped}"
        for rule in self.deny:
            if rule.matches(host, plain, port):
                return f"address {shown} of {host}:{port} is denied by RSCHED_HTTP_DENY " \
                       f"entry {rule.text!r}"
        for rule in self.allow:
            if rule.matches(host, plain, port):
                return None
        for net, name in BLOCKED:
            if plain.version == net.version and plain in net:
                return (f"address {shown} of {host}:{port} is refused: {name} ({net}); "
                        "allow it with RSCHED_HTTP_ALLOW")
        return None


def parse_rules(text: str | None, variable: str) -> tuple[Rule, ...]:
    """A comma list of CIDRs, addresses and host names, each with an optional :port
    (an IPv6 address with a port in brackets: ``[::1]:8080``)."""
    rules = []
    for entry in (e.strip() for e in (text or "").split(",")):
        if entry:
            rules.append(_rule(entry, variable))
    return tuple(rules)


def _rule(entry: str, variable: str) -> Rule:
    body, port = entry, None
    if body.startswith("["):
        addr, _, rest = body[1:].partition("]")
        body, port = addr, _port(rest.removeprefix(":"), entry, variable) if rest else None
    elif body.count(":") == 1:
        body, _, p = body.partition(":")
        port = _port(p, entry, variable)
    try:
        return Rule(entry, network=ipaddress.ip_network(body, strict=False), port=port)
    except ValueError:
        pass
    if "/" in body or not body or not all(c.isalnum() or c in "-._" for c in body):
        raise ValidationError(variable, f"{entry!r} is no address, CIDR or host name")
    return Rule(entry, host=body.lower().rstrip("."), port=port)


def _port(text: str, entry: str, variable: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValidationError(variable, f"{entry!r}: the port must be a number 1-65535")
    return int(text)


__all__ = ["BLOCKED", "Guard", "Rule", "parse_rules"]
