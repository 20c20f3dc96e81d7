"""How rsched's Redis connections differ from redis-py's own: commands packed with hiredis (sync
and asyncio), and on asyncio a write to a connection uvloop closed taken for a dropped connection.
Applied to each client's pool by rsched.rdb.connect (and to a client a caller hands in)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError

from rsched.rdb.setup import closed_transport

_hiredis_pack: Any
try:  # redis.asyncio always packs commands in Python; the sync client's hiredis path is slow too
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a declared dependency (redis[hiredis])
    _hiredis_pack = None


def _pack(args: tuple[Any, ...]) -> list[bytes]:
    if isinstance(args[0], str) and " " in args[0]:  # "CONFIG GET" -> two arguments
        args = (*args[0].split(), *args[1:])
    try:
        return [_hiredis_pack(args)]
    except TypeError as e:
        raise DataError(str(e)) from None


class _HiredisPack:
    """Mixin for asyncio connections: pack commands with hiredis.  redis.asyncio's Python packer
    copies its buffer once per argument, and a schedule script call has thousands of them: it
    was the API's top cost."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack(args)


class _HiredisPacker:
    """The sync client's packer: redis-py's own hiredis packer first copies every argument
    through a Python generator (to turn bytearray and memoryview into bytes), which cost as much
    as the packing; rsched sends neither, and what hiredis refuses goes the old way."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback

    def pack(self, *args: Any) -> list[bytes]:
        try:
            return _pack(args)
        except DataError:
            return self.fallback.pack(*args)  # type: ignore[no-any-return]


class _HiredisSyncPack:
    """Mixin for sync connections: build them with _HiredisPacker."""

    def _construct_command_packer(self, packer: Any) -> Any:
        default = super()._construct_command_packer(packer)  # type: ignore[misc]
        return default if packer is not None else _HiredisPacker(default)


def fast_packing(r: Any) -> Any:
    """Make a client (sync or asyncio) pack commands with hiredis; see the mixins above.
    Connections the pool already holds keep their packer; a cluster client (no single pool)
    is left as it is."""
    from redis.asyncio.connection import AbstractConnection as AsyncConnection

    pool = getattr(r, "connection_pool", None)
    if pool is None or _hiredis_pack is None:
        return r
    async_ = issubclass(pool.connection_class, AsyncConnection)
    return _mix_in(r, "Hiredis", _HiredisPack if async_ else _HiredisSyncPack)


def reconnecting(r: Any) -> Any:
    """Make an asyncio client take uvloop's closed-transport error for a dropped connection
    (see _ClosedTransportIsUnavailable), so its retries reconnect."""
    return _mix_in(r, "Reconnecting", _ClosedTransportIsUnavailable)


def _mix_in(r: Any, prefix: str, mixin: type) -> Any:
    """Build the client's future connections from a subclass with ``mixin`` first."""
    pool = getattr(r, "connection_pool", None)
    if pool is not None and not issubclass(pool.connection_class, mixin):
        cls = pool.connection_class
        pool.connection_class = type(f"{prefix}{cls.__name__}", (mixin, cls), {})
    return r


class _ClosedTransportIsUnavailable:
    """Mixin for asyncio connections: a write to a dropped connection under uvloop raises a
    RuntimeError (see closed_transport), which neither redis-py's retries nor rsched's loops
    took for a connection error (the dispatcher logged it as a bug).  As a ConnectionError the
    command is retried on a new connection (redis-py has closed this one already)."""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]
        except RuntimeError as e:
            if not closed_transport(e):
                raise
            raise RedisConnectionError(f"connection closed: {e}") from e


__all__ = ["fast_packing", "reconnecting"]
