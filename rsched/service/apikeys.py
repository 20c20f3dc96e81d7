"""API keys: Bearer secrets stored as sha256 hashes, each with one scope.

Scopes nest: ``read`` (GET), ``write`` (schedule and change jobs; includes read), ``admin``
(dead-letter replay and key management; includes everything).  Redis holds only the hash of a
secret (HASH rsched:apikeys, sha256 hex -> msgpack record), so a Redis dump reveals no usable
key; the secret is shown once, when the key is created.  A secret is 256 random bits, so an
unsalted fast hash is enough: there is nothing to brute-force.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from rsched.core.errors import Conflict, NotFound, ValidationError
from rsched.core.spec import KEY_NAME_PATTERN
from rsched.rdb.ops import Op
from rsched.rdb.shared_keys import op_api_key, op_api_keys, op_delete_api_key, op_put_api_key

SCOPES = ("read", "write", "admin")
_RANK = {s: i for i, s in enumerate(SCOPES)}
_NAME = re.compile(KEY_NAME_PATTERN)
SECRET_PREFIX = "rsk_"


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    name: str
    scope: str
    created_ms: int

    def allows(self, needed: str) -> bool:
        """True if this key's scope covers ``needed``."""
        return _RANK.get(self.scope, -1) >= _RANK[needed]

    def pack(self) -> bytes:
        record = {"id": self.id, "name": self.name, "scope": self.scope,
                  "created_ms": self.created_ms}
        return bytes(msgpack.packb(record))

    @classmethod
    def unpack(cls, raw: bytes) -> ApiKey:
        d = msgpack.unpackb(raw, raw=False)
        return cls(str(d["id"]), str(d["name"]), str(d["scope"]), int(d["created_ms"]))


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_scope(scope: Any) -> str:
    if scope not in SCOPES:
        raise ValidationError("scope", "must be one of " + ", ".join(SCOPES))
    return str(scope)


def op_create_key(name: Any, scope: Any) -> Op[tuple[ApiKey, str]]:
    """A new key and its secret (shown once; only its hash is stored)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationError("name", "must be 1-64 characters of letters, digits, space _ . : @ -")
    key = ApiKey(f"key_{secrets.token_hex(6)}", name, check_scope(scope), int(time.time() * 1000))
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    yield from op_put_api_key(hash_secret(secret), key.pack())
    return key, secret


def op_list_keys() -> Op[list[ApiKey]]:
    raw = yield from op_api_keys()
    return sorted((ApiKey.unpack(v) for v in raw.values()), key=lambda k: (k.created_ms, k.id))


def op_revoke_key(ident: str) -> Op[ApiKey]:
    """Delete the key with this id, or with this name if exactly one key has it."""
    raw = yield from op_api_keys()
    found = [(h, k) for h, k in ((h, ApiKey.unpack(v)) for h, v in raw.items()) if k.id == ident]
    if not found:
        found = [(h, k) for h, k in ((h, ApiKey.unpack(v)) for h, v in raw.items())
                 if k.name == ident]
        if len(found) > 1:
            raise Conflict("id", f"{len(found)} keys are named {ident!r}: revoke one by its id")
    if not found:
        raise NotFound("API key", ident)
    yield from op_delete_api_key(found[0][0])
    return found[0][1]


def op_lookup(secret: str) -> Op[ApiKey | None]:
    raw = yield from op_api_key(hash_secret(secret))
    return ApiKey.unpack(raw) if raw else None
