"""Cross-site requests and DNS rebinding cannot change our state: a state-changing request is
refused when its body is not `application/json` (other types a page sends cross-site only after
an unanswered CORS preflight), its `Origin` is not its Host, or its Host is a name we do not know
(IP literals and single-label names are fine: rebinding needs a public domain)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from exporter.core.errors import RequestError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_LOCAL_SUFFIXES = (".localhost", ".svc", ".svc.cluster.local")
# What a page may send cross-site without a CORS preflight (the Fetch standard's list).
_PAGE_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data",
                         "text/plain"})


def host_name(host: str) -> str:
    """The name part of a Host header or URL authority, lowercased, brackets and port gone."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def default_hosts(listen: str) -> frozenset[str]:
    """The names we answer to without configuration: listen host, localhost, our own names."""
    names = {"localhost", host_name(listen)}
    for name in (socket.gethostname(), os.environ.get("SPECDEC_POD_NAME", "")):
        if name:
            names.add(name.lower())
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn().lower())
    return frozenset(n.rstrip(".") for n in names if n)


def host_allowed(name: str, allowed: frozenset[str]) -> bool:
    """Whether a request to Host `name` may change state."""
    name = name.rstrip(".")
    if not name:
        return False
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        return True
    if "." not in name or name in allowed or name.endswith(_LOCAL_SUFFIXES):
        return True
    return any(p.startswith("*.") and name.endswith(p[1:]) for p in allowed)


def check_browser_safe(headers: Mapping[str, str], has_body: bool, allowed: frozenset[str]) -> None:
    """`RequestError` (403 or 415) when a state-changing request could come from a web page."""
    host = headers.get("Host", "")
    if not host_allowed(host_name(host), allowed):
        raise RequestError(
            f'Host "{host}" is not one of ours (add it to allowed_hosts if it is): '
            "state-changing requests are refused for unknown names (DNS rebinding)", status=403)
    origin = headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin)
        if origin == "null" or parts.netloc.lower() != host.strip().lower():
            raise RequestError(
                f'Origin "{origin}" is not this exporter ({host}): cross-site requests are '
                "refused", status=403)
    kind = headers.get("Content-Type", "").split(";")[0].strip().lower()
    if kind in _PAGE_TYPES or (has_body and kind != "application/json"):
        raise RequestError(
            f"Content-Type must be application/json, not {kind or 'none'}: other types are "
            "what a web page can send across sites", status=415)
