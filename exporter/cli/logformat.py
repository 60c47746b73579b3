"""The stderr voice of every command: logging's lines and the CLI's own messages, plain text or
(`--log-format json`) one JSON object per line, each field its own key."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from exporter.core.redact import fields_of

_OWN_KEYS = ("ts", "level", "logger", "event", "msg")


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: time, level, logger, event, the whole message, then each
    `key=value` of the message (or the record's `specdec_fields`) as a key of its own."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = fields_of(record)
        body: dict[str, Any] = {"ts": record.created, "level": record.levelname.lower(),
                                "logger": record.name, "event": event,
                                "msg": record.getMessage()}
        for key, value in fields.items():
            # A field named like one of ours keeps both: Loki and Elasticsearch want one each.
            body[f"field_{key}" if key in _OWN_KEYS else key] = value
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            body["exc"] = record.exc_text
        return json.dumps(body, default=str)


def setup_logging(level: str, fmt: str) -> None:
    """Root logging on stderr at `level`, plain or JSON; aiohttp's access log at debug only."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    access = logging.DEBUG if level == "debug" else logging.WARNING
    logging.getLogger("aiohttp.access").setLevel(access)


def json_messages() -> bool:
    """Whether the CLI's own messages are JSON lines (`--log-format json`)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def say_json(message: str, level: int, fields: dict[str, Any]) -> None:
    """A CLI message as a JSON line through the root handlers (their redaction included),
    whatever `--log-level` says: a message the plain voice prints is never dropped."""
    record = logging.makeLogRecord({
        "name": "specdec-exporter", "levelno": level, "levelname": logging.getLevelName(level),
        "msg": message, "specdec_event": message, "specdec_fields": fields})
    for handler in logging.getLogger().handlers:
        handler.handle(record)
