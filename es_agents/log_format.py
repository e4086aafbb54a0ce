"""Logs for people and for machines: one JSON object per line when stderr is not a
terminal (or ``ES_AGENTS_LOG_FORMAT=json``), a readable line on a terminal
(``ES_AGENTS_LOG_FORMAT=text`` forces it).

A record's ``extra`` fields (``run_id``, ``step``, ``agent``, ``event``,
``reason``...) become keys of its JSON object, and ``key=value`` pairs in text.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

# Attributes every LogRecord has: what is not among them came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _extra(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = _extra(record)
        if extra:
            line += "  " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def configure(level: int = logging.INFO) -> None:
    """Root logging on stderr, JSON or text as described above (idempotent: a
    level set by ``--log-level`` first is kept)."""
    chosen = os.environ.get("ES_AGENTS_LOG_FORMAT", "")
    as_json = chosen == "json" or (chosen != "text" and not sys.stderr.isatty())
    root = logging.getLogger()
    if root.handlers:  # configured already (--log-level): keep its level
        level = root.level
        for handler in root.handlers:
            handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level)
