"""COPY text for Postgres, built straight from raw stream entries: the archiver's hot path.

An entry whose fields are all plain (known names, ASCII or valid UTF-8, no tab, newline,
backslash or NUL, unsigned integers of at most 18 digits) becomes its line by joining the bytes
Redis sent, with no Python object per field.  Anything else goes through ``decode`` (which never
fails) and is escaped; both give the same row, which the tests check.
"""

from __future__ import annotations

from collections.abc import Iterable

from .events import KNOWN, Entry, EventRow, decode_flat

_NULL = b"\\N"
_SPECIAL = (b"\\", b"\t", b"\n", b"\r", b"\x00")


def _plain_int(v: bytes) -> bool:
    return v is _NULL or (v.isdigit() and len(v) < 19)


def fast_line(part: bytes, sid: bytes, flat: list[bytes]) -> bytes | None:
    """The COPY line of a plain entry, or None when it needs the careful path."""
    raw = b"".join(flat)
    if any(c in raw for c in _SPECIAL):
        return None
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:
            return None
    f = dict(zip(flat[::2], flat[1::2], strict=True))
    if not f.keys() <= KNOWN:
        return None
    g = f.get
    r = g(b"r")
    a, t, d, fe, at = g(b"a") or _NULL, g(b"t") or _NULL, g(b"d") or _NULL, g(b"f") or _NULL, \
        g(b"at") or _NULL  # fmt: skip
    s = g(b"s") or _NULL
    if r:
        head, at_sign, tail = r.rpartition(b"@")
        if at_sign and tail.isdigit() and len(tail) < 19:
            s = tail  # every event of a run carries the run's time (see events.decode)
    if not (_plain_int(a) and _plain_int(t) and _plain_int(d) and _plain_int(s)
            and _plain_int(fe) and _plain_int(at)):
        return None
    ms, _, seq = sid.partition(b"-")
    return b"\t".join((
        ms, seq or b"0", part, g(b"e") or b"", g(b"j") or _NULL, r or _NULL, a, t,
        g(b"w") or _NULL, d, g(b"ty") or _NULL, g(b"q") or _NULL, s, g(b"err") or _NULL,
        g(b"res") or _NULL, fe, at, _NULL,
    ))


def _field(v: object) -> bytes:
    if v is None:
        return _NULL
    if isinstance(v, int):
        return str(v).encode()
    text = str(v)
    for char, escaped in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
        text = text.replace(char, escaped)
    return text.encode()


def row_line(row: EventRow) -> bytes:
    """The COPY line of a decoded row (the careful path)."""
    return b"\t".join(_field(v) for v in row)


def copy_text(entries: Iterable[Entry]) -> bytes:
    """COPY ... FROM STDIN (text format) data for the entries, one line each."""
    parts: dict[int, bytes] = {}
    lines = []
    for part, sid, flat in entries:
        pb = parts.get(part)
        if pb is None:
            pb = parts[part] = str(part).encode()
        line = fast_line(pb, sid, flat)
        lines.append(line if line is not None else row_line(decode_flat(part, sid, flat)))
    lines.append(b"")
    return b"\n".join(lines)
