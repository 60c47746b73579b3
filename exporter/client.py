"""A small blocking client of the exporter's window API, for AISBench and any Python harness
(README shows its use); standard library only, so importing it costs a harness nothing."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from exporter.analysis.advise import window_advice
from exporter.core.aisbench import Result, aggregate
from exporter.core.console import format_window
from exporter.core.errors import ExporterError
from exporter.core.perrequest import format_per_request
from exporter.core.redact import redact_url
from exporter.core.window import new_window_id


class ClientError(ExporterError):
    """The exporter could not be reached, or refused the request (with its reason)."""


@dataclass(frozen=True)
class WindowAnswer:
    """A stop answer (CONTRACT.md's shape) with the console rendering at hand."""

    body: dict[str, Any]

    def console(self) -> str:
        """Every target's console block, `all` for two or more, then any per-request sections."""
        return format_window(self.body) + format_per_request(self.body)


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """urllib's opener, straight to a loopback exporter whatever HTTP_PROXY says: a proxy cannot
    reach our loopback, and a harness behind a proxy rarely lists 127.0.0.1 in NO_PROXY."""
    host = urlsplit(url).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost" or host.endswith(".localhost")
    if loopback:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without `user:password@`, its Basic authorization value or None): urllib reads
    `user:pass@host` as the host name, and a reverse proxy with basic auth needs them."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    return urlunsplit(parts._replace(netloc=host)), "Basic " + base64.b64encode(pair).decode()


def exporter_base_url(text: str) -> str:
    """An exporter's base URL as given anywhere (`--exporter`, the client): `host:port` means
    `http://host:port`, as it does for targets; a scheme other than http(s) is a ClientError."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unclosed IPv6 bracket
        host = None
    if not host or parts.scheme.lower() not in ("http", "https"):
        raise ClientError(f"exporter URL {redact_url(text.strip())!r}: give host:port or "
                          "http(s)://host:port")
    return url


class ExporterClient:
    """Starts and stops windows on one exporter."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0):
        url = exporter_base_url(url)
        # `url` is what messages show: credentials in it never reach a terminal or a log.
        self.url = redact_url(url)
        self._base, self._basic = split_userinfo(url)
        self.token = token if token is not None else os.environ.get("SPECDEC_TOKEN") or None
        self.timeout = timeout
        self.status = 0  # of the last answer: 201 tells a new window from a retried start
        self._opener = opener_for(self._base)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        # The exporter's own token wins; URL credentials are for a proxy in front of it.
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        elif self._basic:
            request.add_header("Authorization", self._basic)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read())  # the API answers objects
                self.status = response.status
                return answer
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                reason = exc.reason
            raise ClientError(f"exporter {self.url} answered {exc.code}: {reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"exporter {self.url} unreachable: {reason}") from None

    def start(
        self,
        window_id: str | None = None,
        name: str | None = None,
        targets: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
        *, edges: str | None = None, skip_requests: int | None = None,
    ) -> dict[str, Any]:
        """Open a window; returns {"id", "name", "targets", "started_at", "created"}, `created`
        False for an identical retry. `edges="traffic"` opens it at the first request through
        the recording proxy past `skip_requests` of them (`started_at` null until then)."""
        body: dict[str, Any] = {}
        if edges == "traffic":
            body["edges"] = edges
            if skip_requests is not None:
                body["skip_requests"] = skip_requests
        given = {"id": window_id, "name": name, "targets": list(targets or ()), "labels": labels}
        body |= {key: value for key, value in given.items() if value}
        answer = self._call("POST", "/api/v1/windows", body)
        return answer | {"created": self.status == 201}

    def stop(self, window_id: str) -> WindowAnswer:
        """Close a window; returns its results."""
        return WindowAnswer(self._call("POST", f"/api/v1/windows/{window_id}/stop"))

    def get(self, window_id: str) -> dict[str, Any]:
        """A window's state or results."""
        return self._call("GET", f"/api/v1/windows/{window_id}")


class FleetClient:
    """Windows across several exporters (shards of one fleet): one id, merged results. Shards
    configured with `peers` do this themselves: one URL is enough."""

    def __init__(self, urls: Sequence[str], token: str | None = None, timeout: float = 60.0):
        if not urls:
            raise ClientError("no exporter URL given")
        self.clients = [ExporterClient(url, token, timeout) for url in urls]

    def _each(
        self, call: Callable[[ExporterClient], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        answers: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        for client in self.clients:
            try:
                answers.append(call(client))
            except ClientError as exc:
                errors[client.url] = str(exc)
        if not answers:
            raise ClientError("; ".join(errors.values()))
        return answers, errors

    def start(self, window_id: str | None = None, *args: Any, **options: Any) -> dict[str, Any]:
        """Open the window on every exporter under one id (`ExporterClient.start`'s arguments)."""
        if len(self.clients) == 1:
            return self.clients[0].start(window_id, *args, **options)
        window_id = window_id or new_window_id(time.time())
        answers, errors = self._each(lambda c: c.start(window_id, *args, **options))
        merged = answers[0] | {
            "targets": [t for a in answers for t in a["targets"]],
            "created": any(a.get("created") for a in answers),
            # Every shard's failed start scrapes: `window start` names them all on stderr.
            "start_errors": {n: e for a in answers for n, e in a.get("start_errors", {}).items()},
        }
        return merged | ({"errors": errors} if errors else {})

    def stop(self, window_id: str) -> WindowAnswer:
        """Close the window everywhere; one merged answer."""
        if len(self.clients) == 1:
            return self.clients[0].stop(window_id)
        answers, errors = self._each(lambda c: c.stop(window_id).body)
        return WindowAnswer(merge_answers(answers) | ({"errors": errors} if errors else {}))


def merge_answers(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One answer from several shards' answers for the same window: the aggregate recomputed
    from every per-target count, never from the shards' aggregates (ratios do not add)."""
    results = {name: result for a in answers for name, result in a.get("results", {}).items()}
    merged = answers[0] | {
        "targets": [t for a in answers for t in a.get("targets", [])],
        "stopped_at": max(a.get("stopped_at") or 0 for a in answers),
        "results": results,
        "aggregate": aggregate((n, Result.from_json(r)) for n, r in results.items()).to_json(),
    }
    # Each shard's advice covers only its own targets: advise again over the merged whole.
    return merged | {"advice": window_advice(merged)}

