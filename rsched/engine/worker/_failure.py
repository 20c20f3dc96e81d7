"""The text a failed attempt records: the exception's summary line first (logs, tables and
lists show that line), then its traceback, so an operator sees where a dead letter failed."""

from __future__ import annotations

import traceback

MAX_SUMMARY_CHARS = 2000
MAX_ERROR_CHARS = 8000  # the summary and the traceback's innermost frames, at most


def failure_text(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``Type: message``, a blank line, the traceback; a long traceback keeps its end (the
    frames nearest the raise) and says how much was left out."""
    head = f"{type(exc).__name__}: {exc}"[:MAX_SUMMARY_CHARS]
    tb = "".join(traceback.format_exception(exc)).rstrip()
    text = f"{head}\n\n{tb}"
    if len(text) <= limit:
        return text
    keep = max(limit - len(head) - 64, 0)
    return f"{head}\n\n[{len(tb) - keep} characters of the traceback left out]\n{tb[-keep:]}"


__all__ = ["MAX_ERROR_CHARS", "failure_text"]
