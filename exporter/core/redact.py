"""Credentials kept out of everything we show or write (URLs, error texts, log records): like
Prometheus we write `<secret>` in their place."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from exporter.core.logfields import message_fields

SECRET = "<secret>"
# scheme://userinfo@ anywhere in a text (error messages quote URLs).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s?#]*@")
# A header line or a Python dict repr of one: the value goes, the name stays.
_AUTH_HEADER = re.compile(
    r"(?i)((?:authorization|proxy-authorization|cookie|set-cookie|x-api-key)['\"]?\s*[:=]\s*"
    r"['\"]?)(?:(?:bearer|basic|token)\s+)?[^\r\n'\",}]+"
)
# A credential after the scheme word; a plain word there ("a bearer token") is our own prose,
# and no token is one lowercase word, so that one shape is left alone.
_BEARER = re.compile(
    r"\b((?i:bearer|basic))\s+(?![A-Za-z][a-z]*\b(?![._~+/=-]))[A-Za-z0-9._~+/=-]+")
_SHORTEST = 4  # a "secret" shorter than this would redact ordinary words of every log line


def redact_url(url: str) -> str:
    """The URL with its user and password replaced by `<secret>` (the rest as given)."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(rf"\1{SECRET}@", url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{SECRET}@{host}"))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without URL userinfo, authorization header values or any of `secrets`."""
    text = _USERINFO.sub(rf"\1{SECRET}@", text)
    text = _AUTH_HEADER.sub(rf"\1{SECRET}", text)
    text = _BEARER.sub(rf"\1 {SECRET}", text)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _SHORTEST:
            text = text.replace(secret, SECRET)
    return text


def config_secrets(config: Any) -> frozenset[str]:
    """Every credential a config points at: header values, URL passwords, tokens it names."""
    found: set[str] = set()
    env_names = {config.auth.token_env}
    for source in [*config.targets, *config.http_sd, *config.prometheus_sd]:
        found.update(source.headers.values())
        if source.token_env:
            env_names.add(source.token_env)
        parts = urlsplit(source.url)
        found.update(p for p in (parts.password, parts.username) if p)
    found.update(v for name in env_names if (v := os.environ.get(name)))
    return frozenset(found)


class RedactingFilter(logging.Filter):
    """Rewrites each record (message and traceback) without credentials. On the handler, not
    a logger, so aiohttp's loggers pass through it too; `config` returns the running config."""

    def __init__(self, config: Callable[[], Any] | None = None):
        super().__init__()
        self.config = config
        self._seen: Any = None
        self._secrets: frozenset[str] = frozenset()

    def _known(self) -> frozenset[str]:
        if self.config is None:
            return frozenset()
        config = self.config()
        if config is not self._seen:
            self._seen, self._secrets = config, config_secrets(config)
        return self._secrets

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._known()
        # The fields first, from the message's own shape, which flattening it loses.
        event, fields = fields_of(record)
        record.specdec_event = redact_text(event, secrets)
        record.specdec_fields = {k: redact_text(v, secrets) if isinstance(v, str) else v
                                 for k, v in fields.items()}
        record.msg = redact_text(record.getMessage(), secrets)
        record.args = None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact_text(text, secrets)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text, secrets)
        return True


def fields_of(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    """A record's event and fields: given with it (`specdec_fields`), else from its message."""
    given = getattr(record, "specdec_fields", None)
    if isinstance(given, dict):
        return str(getattr(record, "specdec_event", record.getMessage())), given
    return message_fields(record.msg, record.args)


def redact_logs(config: Callable[[], Any]) -> None:
    """Put a `RedactingFilter` over `config()`'s secrets on every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(RedactingFilter(config))
