"""The redis-py names the layers above rdb use: the exception types their ``except`` clauses
catch and the client types their signatures name, re-exported so that only rdb imports redis
(tests/unit/test_layers.py)."""

from __future__ import annotations

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["AsyncRedis", "Redis", "RedisConnectionError", "RedisError", "RedisTimeoutError",
           "ResponseError"]
