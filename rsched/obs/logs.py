"""Log lines for people (readable text) or for machines (one JSON object per line).

Lines about a run carry its job id, run id and attempt: callers pass them as
``extra={"job_id": ..., "run_id": ..., "attempt": ...}`` and both formats print them, so
``grep run_id`` or a log pipeline's field filter finds every line of one run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

from rsched.core.errors import ValidationError

ENV_FORMAT = "RSCHED_LOG_FORMAT"
FORMATS = ("text", "json")
RUN_FIELDS = ("job_id", "run_id", "attempt")

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "color_message",  # uvicorn's ANSI-coloured copy
}


def _run_fields(record: logging.LogRecord) -> dict[str, Any]:
    """job_id, run_id and attempt of the record; the job id is read off the run id if missing."""
    out = {k: v for k in RUN_FIELDS if (v := record.__dict__.get(k)) is not None}
    if "run_id" in out and "job_id" not in out:
        out["job_id"] = str(out["run_id"]).rsplit("@", 1)[0]
    return {k: out[k] for k in RUN_FIELDS if k in out}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items()
            if k not in _STANDARD and k not in RUN_FIELDS and not k.startswith("_")}


def _iso(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "job_id", "run_id", "attempt", ...extras, "exc"}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created), "level": record.levelname.lower(),
            "logger": record.name, "msg": record.getMessage(),
        }
        out.update(_run_fields(record))
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-03-08T07:00:00.123Z WARNING rsched.worker message job=... run=... attempt=2``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname} {record.name} {record.getMessage()}"
        tags = [f"{k.removesuffix('_id')}={v}" for k, v in _run_fields(record).items()]
        tags += [f"{k}={v}" for k, v in _extras(record).items()]
        if tags:
            line += "  " + " ".join(tags)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def log_format(value: str | None = None) -> str:
    """The format asked for (option, else ``RSCHED_LOG_FORMAT``, else text), checked."""
    fmt = (value or os.environ.get(ENV_FORMAT) or "text").strip().lower()
    if fmt not in FORMATS:
        where = "--log-format" if value else ENV_FORMAT
        raise ValidationError(where, f"must be text or json, got {fmt!r}")
    return fmt


def setup(level: str | int = "INFO", fmt: str | None = None,
          stream: TextIO | None = None) -> logging.Handler:
    """Send every logger's records to stderr in the chosen format, replacing an earlier
    set-up's handler; returns the handler (to remove it again)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format(fmt) == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_rsched", False):
            root.removeHandler(h)
    handler._rsched = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    if isinstance(level, str):
        level = level.upper()
    root.setLevel(level)
    return handler


__all__ = ["JsonFormatter", "TextFormatter", "log_format", "setup"]
