"""How the operator commands print: tables for people, the API's JSON shapes with ``--json``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import click

from rsched.core.errors import Conflict, ValidationError
from rsched.core.values import jsonable

JSON_FLAG = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
PAGE_FLAGS = {"limit": "--limit", "cursor": "--cursor"}
"""A paged read's flags by the field its errors name (see naming_flags)."""


def print_json(value: Any) -> None:
    """The --json output: the API's shapes, indented (a part nested past the encoder's limit
    shown as a placeholder: core.values.jsonable)."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except RecursionError:
        text = json.dumps(jsonable(value), indent=2, ensure_ascii=False)
    click.echo(text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain left-aligned columns; None prints as '-', a value of several lines (a traceback) as
    its first line and an ellipsis: --json has it whole."""
    cells = [[("-" if v is None else _first_line(str(v))) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _first_line(text: str) -> str:
    first, nl, rest = text.partition("\n")
    return f"{first} ..." if nl and rest.strip() else first


def more(cursor: str | None, command: str) -> None:
    """On stderr, the command that prints the next page, if there is one."""
    if cursor:
        click.echo(f"more: {command} --cursor {cursor}", err=True)


def show(value: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """``value`` as JSON with --json, else as ``render`` makes it."""
    if as_json:
        print_json(value)
    else:
        click.echo(render(value))


_ROOT = re.compile(r"[A-Za-z]+")


@contextmanager
def naming_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """The service layer's errors name the API's fields (``runAt``); the user typed flags
    (``--run-at``): re-raise them naming those, and the spot inside a JSON flag's value."""
    try:
        yield
    except (ValidationError, Conflict) as e:
        if e.field in flags:  # a nested field with a flag of its own (backoff.baseSeconds)
            raise type(e)(flags[e.field], _CAMEL.sub(
                lambda w: flags.get(w.group(), w.group()), e.reason)) from None
        m = _ROOT.match(e.field)
        flag = flags.get(m.group()) if m else None
        if m is None or flag is None:
            raise
        inner = e.field[m.end():].lstrip(".")
        reason = _CAMEL.sub(lambda w: flags.get(w.group(), w.group()), e.reason)
        raise type(e)(flag, f"at {inner}: {reason}" if inner else reason) from None


_CAMEL = re.compile(r"\b[a-z]+[A-Z][A-Za-z]*\b")  # an API field a reason mentions (runAt)


def summary(error: str | None) -> str | None:
    """An error's first line: a table cell holds no traceback (--json has it all)."""
    return None if error is None else error.partition("\n")[0]
