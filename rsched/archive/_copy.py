"""COPY text for Postgres, built straight from raw stream entries: the archiver's hot path.

An entry whose fields are all plain (known names, ASCII or valid UTF-8, no tab, newline,
backslash or NUL, unsigned integers of at most 18 digits) becomes its line by joining the bytes
Redis sent, with no Python object per field.  Anything else goes through ``decode`` (which never
fails) and is escaped; both give the same row, which the tests check.
"""

from __future__ import annotations

from collections.abc import Iterable

from rsched.archive.events import KNOWN, Entry, EventRow, decode_flat

_NULL = b"\\N"
_E = b""
_SPECIAL = b"\\\t\n\r\x00"  # what COPY text would need escaped, and NUL (no NUL in text)


def fast_line(part: bytes, sid: bytes, flat: list[bytes]) -> bytes | None:
    """The COPY line of a plain entry, or None when it needs the careful path.

    Written flat on purpose (no helper calls, no generators): it runs once per archived event.
    """
    raw = _E.join(flat)
    if len(raw.translate(None, _SPECIAL)) != len(raw):  # one pass over the bytes
        return None
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:
            return None
    f = dict(zip(flat[::2], flat[1::2], strict=False))  # Redis sends pairs
    if not f.keys() <= KNOWN:
        return None
    g = f.get
    r, a, t, d, s, fe, at, st = (g(b"r"), g(b"a"), g(b"t"), g(b"d"), g(b"s"), g(b"f"), g(b"at"),
                                 g(b"st"))
    j = g(b"j")
    if r:
        head, at_sign, tail = r.rpartition(b"@")
        if at_sign and tail.isdigit() and len(tail) < 19:
            s = tail  # every event of a run carries the run's time (see events.decode)
        if not j and at_sign:
            j = head  # run events leave the job id to the run id (events.job_of_event_run)
    ints = (a or _E, t or _E, d or _E, s or _E, fe or _E, at or _E, st or _E)
    digits = _E.join(ints)
    if digits and (not digits.isdigit() or max(map(len, ints)) > 18):
        return None  # signed, huge or not a number: decode keeps it in `extra`
    ms, _, seq = sid.partition(b"-")
    return b"\t".join((
        ms, seq or b"0", part, g(b"e") or _E, j or _NULL, r or _NULL, a or _NULL,
        t or _NULL, g(b"w") or _NULL, d or _NULL, g(b"ty") or _NULL, g(b"q") or _NULL,
        s or _NULL, g(b"err") or _NULL, g(b"res") or _NULL, fe or _NULL, at or _NULL, _NULL,
        st or _NULL,
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
