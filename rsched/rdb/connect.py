"""The one connection factory: every process and face turns RSCHED_REDIS_URL into a client here.

Schemes:
  redis://, rediss://, unix://                      one Redis (redis-py's own URL syntax)
  redis+cluster://[user:pass@]host:port[,host:port...][?options]   Redis Cluster (any nodes as
                                                    seeds; the rest are discovered)
  redis+sentinel://[user:pass@]host:port[,host:port...]/<service>[/<db>][?options]
                                                    the primary that the Sentinels name, followed
                                                    across failovers
  rediss+cluster://, rediss+sentinel://             the same over TLS
Options are redis-py's URL query options (socket_timeout=5, ...), applied to every node;
``sentinel_password`` is the Sentinels' own password when it differs from the data nodes'.
``address_remap=host:port=host:port[,...]`` (cluster URLs) connects to the second address of a
pair wherever the cluster advertises the first (NAT, containers: docs/redis.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsched.core import defaults
from rsched.core.errors import RschedError
from rsched.rdb.cluster import AsyncClusterRedis, ClusterRedis
from rsched.rdb.connections import fast_packing, reconnecting
from rsched.rdb.durable import set_wait
from rsched.rdb.slots import Address, Remap

Kind = Literal["single", "cluster", "sentinel"]
SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("single", False), "rediss": ("single", True), "unix": ("single", False),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
}
REMAP_OPTION = "address_remap"


class BadRedisUrl(RschedError, ValueError):
    """RSCHED_REDIS_URL (or --redis-url) cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Target:
    """What a Redis URL names, parsed once."""

    kind: Kind
    url: str  # the URL as given (a single Redis connects with it as it is)
    tls: bool = False
    nodes: tuple[Address, ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    remap: dict[Address, Address] = field(default_factory=dict)  # the URL's address_remap

    def node_url(self, host: str, port: int) -> str:
        """A plain URL for one node, with this URL's credentials and options."""
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in self.options.items()
                         if k != "sentinel_password")
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}{host}:{port}/{self.db}" + (f"?{query}" if query else "")


def parse(url: str) -> Target:
    """Parse a Redis URL; BadRedisUrl names what is wrong with it."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise BadRedisUrl(f"Redis URL {_safe(url)!r}: the scheme must be one of "
                          f"{', '.join(s + '://' for s in SCHEMES)}")
    kind, tls = SCHEMES[scheme]
    if kind == "single":
        if REMAP_OPTION in dict(parse_qsl(urlsplit(url).query)):
            raise _remap_not_here(url)
        return Target("single", url, tls)
    u = urlsplit(url)
    netloc = u.netloc.rsplit("@", 1)
    hosts = netloc[-1]
    username = password = None
    if len(netloc) == 2:
        user, _, pw = netloc[0].partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    nodes = tuple(_address(h, url) for h in hosts.split(",") if h)
    if not nodes:
        raise BadRedisUrl(f"Redis URL {_safe(url)!r}: name at least one host:port")
    options = dict(parse_qsl(u.query))
    remap = _remap_pairs(options.pop(REMAP_OPTION, None), kind, url)
    parts = [p for p in u.path.split("/") if p]
    service, db = "", 0
    if kind == "sentinel":
        if not parts:
            raise BadRedisUrl(f"Redis URL {_safe(url)!r}: name the Sentinel service "
                              "(redis+sentinel://host:port/<service>[/<db>])")
        service = unquote(parts[0])
        parts = parts[1:]
    if parts:
        if len(parts) > 1 or not parts[0].isdigit():
            raise BadRedisUrl(f"Redis URL {_safe(url)!r}: the path after the hosts must be "
                              + ("/<service>[/<db>]" if kind == "sentinel" else "empty"))
        db = int(parts[0])
    if kind == "cluster" and db != 0:
        raise BadRedisUrl(f"Redis URL {_safe(url)!r}: Redis Cluster has only database 0")
    return Target(kind, url, tls, nodes, service, db, username, password, options, remap)


def _remap_not_here(url: str) -> BadRedisUrl:
    return BadRedisUrl(f"Redis URL {_safe(url)!r}: {REMAP_OPTION} applies to redis+cluster:// "
                       "and rediss+cluster:// URLs only")


def _remap_pairs(value: str | None, kind: Kind, url: str) -> dict[Address, Address]:
    """``address_remap``'s pairs: advertised host:port = host:port to connect to."""
    if value is None:
        return {}
    if kind != "cluster":
        raise _remap_not_here(url)
    pairs: dict[Address, Address] = {}
    for pair in value.split(","):
        advertised, sep, actual = pair.partition("=")
        bad = BadRedisUrl(f"Redis URL {_safe(url)!r}: {REMAP_OPTION}: {pair!r} is not "
                          "host:port=host:port")
        if not sep:
            raise bad
        try:
            pairs[_address(advertised, url)] = _address(actual, url)
        except BadRedisUrl:
            raise bad from None
    return pairs


def _remap(t: Target, address_remap: Remap | None) -> Remap | None:
    """The URL's pairs, then for any other address the caller's ``address_remap``."""
    if address_remap is not None and t.kind != "cluster":
        raise _remap_not_here(t.url)
    if not t.remap:
        return address_remap
    pairs = t.remap

    def remap(addr: Address) -> Address:
        if addr in pairs:
            return pairs[addr]
        return address_remap(addr) if address_remap is not None else addr

    return remap


def _address(hostport: str, url: str) -> Address:
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise BadRedisUrl(f"Redis URL {_safe(url)!r}: {hostport!r} is not host:port")
    return host.strip("[]"), int(port)


def _safe(url: str) -> str:
    """The URL with its password masked, for error messages."""
    head, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    auth, _, tail = rest.rpartition("@")
    user = auth.partition(":")[0]
    return f"{head}{sep}{user}:***@{tail}" if sep else url


# --- sync ------------------------------------------------------------------------------------


def wait_replicas(t: Target, setting: int = defaults.WAIT_REPLICAS_BY_URL) -> int:
    """Replicas each client-facing write waits for: the setting, or by URL (1 for a cluster or
    Sentinel URL, whose point is surviving a failover; 0 for one Redis)."""
    if setting != defaults.WAIT_REPLICAS_BY_URL:
        return setting
    return 0 if t.kind == "single" else 1


def connect(url: str, *, wait: int = defaults.WAIT_REPLICAS_BY_URL,
            wait_timeout_ms: int = defaults.WAIT_TIMEOUT_MS,
            address_remap: Remap | None = None, **options: Any) -> Any:
    """A sync client for any supported URL (see the module docstring); ``wait``: replicas that
    confirm each client-facing write (rdb.durable); ``address_remap`` (cluster URLs): the
    address to connect to for each address the cluster advertises, after the URL's pairs."""
    t = parse(url)
    remap = _remap(t, address_remap)
    return set_wait(_connect(t, options, remap), wait_replicas(t, wait), wait_timeout_ms)


def _pool_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options every pool rsched makes gets: its size, unless the caller or the URL says."""
    return {"max_connections": defaults.REDIS_MAX_CONNECTIONS, **options}


def _connect(t: Target, options: dict[str, Any], remap: Remap | None = None) -> Any:
    from redis import Redis

    options = _pool_options(options)
    if t.kind == "single":
        return fast_packing(Redis.from_url(t.url, **options))
    if t.kind == "cluster":
        from redis.retry import Retry

        # No retries of redis-py's own on a node: the router retries once after refreshing
        # the slot map, and a dead node must fail fast (see cluster.DOWN_FOR_S).
        return ClusterRedis(t.nodes, lambda h, p: fast_packing(Redis.from_url(
            t.node_url(h, p), retry=Retry(NoBackoff(), 0), **options)), remap=remap)
    from redis.sentinel import Sentinel

    sentinel = Sentinel(list(t.nodes), sentinel_kwargs=_sentinel_kwargs(t, options),
                        **_node_kwargs(t, options))
    return fast_packing(sentinel.master_for(t.service, redis_class=Redis))


def _node_kwargs(t: Target, options: dict[str, Any]) -> dict[str, Any]:
    from redis.connection import parse_url as redis_parse_url

    kwargs = redis_parse_url(t.node_url("localhost", 6379))
    for k in ("host", "port", "connection_class"):
        kwargs.pop(k, None)
    if t.tls:
        kwargs["ssl"] = True
    return {**kwargs, **options}


def _sentinel_kwargs(t: Target, options: dict[str, Any]) -> dict[str, Any]:
    """The Sentinels' connections: the URL's socket and TLS options (a CA file, a client
    certificate: the Sentinels' TLS ports are verified as the data nodes' are), not its
    credentials unless ``sentinel_password`` says so."""
    kw = {k: v for k, v in _node_kwargs(t, options).items()
          if k.startswith(("socket_", "ssl_"))}
    if "sentinel_password" in t.options:
        kw["password"] = t.options["sentinel_password"]
    if t.tls:
        kw["ssl"] = True
    return kw


# --- asyncio ---------------------------------------------------------------------------------


def _async_retrying(make: Any, **options: Any) -> Any:
    """An asyncio client that retries after connection errors, as the sync client does.

    redis.asyncio's from_url retries nothing by default; every rsched script is safe to apply
    twice, so retrying a command that may or may not have run is sound.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    options.setdefault("retry", Retry(ExponentialBackoff(cap=1.0, base=0.05), 3))
    r = make(retry_on_error=[RedisConnectionError, RedisTimeoutError], **options)
    return fast_packing(reconnecting(r))


def connect_async(url: str, *, wait: int = defaults.WAIT_REPLICAS_BY_URL,
                  wait_timeout_ms: int = defaults.WAIT_TIMEOUT_MS,
                  address_remap: Remap | None = None, **options: Any) -> Any:
    """An asyncio client for any supported URL (``wait``, ``address_remap``: see `connect`)."""
    t = parse(url)
    remap = _remap(t, address_remap)
    return set_wait(_connect_async(t, options, remap), wait_replicas(t, wait), wait_timeout_ms)


def _connect_async(t: Target, options: dict[str, Any], remap: Remap | None = None) -> Any:
    from redis.asyncio import Redis

    options = _pool_options(options)
    if t.kind == "single":
        return _async_retrying(lambda **kw: Redis.from_url(t.url, **kw), **options)
    if t.kind == "cluster":
        from redis.asyncio.retry import Retry

        return AsyncClusterRedis(t.nodes, lambda h, p: _async_retrying(
            lambda **kw: Redis.from_url(t.node_url(h, p), **kw),
            retry=Retry(NoBackoff(), 0), **options), remap=remap)
    from redis.asyncio.sentinel import Sentinel

    class SentinelRedis(Redis):
        """Closing it closes its Sentinels' connections too: the Sentinel object is this
        client's own, and its connections would otherwise be left open at exit."""

        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            await super().aclose(close_connection_pool)
            for s in sentinel.sentinels:
                await s.aclose()

    sentinel = Sentinel(list(t.nodes), sentinel_kwargs=_sentinel_kwargs(t, options),
                        **_node_kwargs(t, options))
    return _async_retrying(
        lambda **kw: sentinel.master_for(t.service, redis_class=SentinelRedis, **kw))
