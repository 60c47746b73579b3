"""Strict, frozen configuration: YAML -> `Config`, with `key.path: what is wrong` errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.config.documents import DocumentError, parse_yaml, read_text
from exporter.config.problems import problem_line
from exporter.config.values import (
    header_name,
    implied_url,
    not_a_bare_port,
    parse_duration,
    parse_matcher,
    parse_retention,
)
from exporter.core.dialects import Dialect, default_path
from exporter.core.errors import ConfigError
from exporter.core.parse import PageLimits
from exporter.core.redact import redact_url
from exporter.core.text import TextError, clean_tree

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_MAX_TARGETS = 10_000
_RESERVED_LABELS = {"target", "model_name", "position", "engine", "le", "quantile"}


# A config is read whole and parsed on every reload: large fleets belong in file_sd/http_sd.
MAX_CONFIG_BYTES = 1024 * 1024
Duration = Annotated[float, BeforeValidator(parse_duration)]

class _KeyError(ValueError):
    """A whole-model check whose problem belongs to one key: located there, not at the top."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


def _check_url(value: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.hostname:
        kinds = " or ".join(f"{scheme}://" for scheme in schemes)
        raise ValueError(f"must be an {kinds} URL with a host, not {value!r}")
    try:
        _ = parts.port  # urlsplit checks the port only when asked
    except ValueError as exc:
        raise ValueError(f"has a bad port: {value!r}") from exc
    return value


# An http(s) URL with a host, or "" (unset); a base URL without its trailing slash.
_URL = Annotated[str, AfterValidator(lambda v: _check_url(v) if v else v)]
_BaseURL = Annotated[str, AfterValidator(lambda v: _check_url(v).rstrip("/") if v else v)]


def _over_interval(value: float | None, interval: float | None) -> str | None:
    """Why a duration longer than scrape_interval is refused (it would stretch every round)."""
    if value is None or interval is None or value <= interval:
        return None
    return f"must not be longer than scrape_interval ({value:g}s > {interval:g}s)"


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port, not {value!r}")
    return value


_HostPort = Annotated[str, BeforeValidator(not_a_bare_port), AfterValidator(_check_host_port)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuthConfig(_Strict):
    """Who may POST: a bearer token read from an environment variable, if that is set."""

    token_env: str = "SPECDEC_TOKEN"


class ProxyConfig(_Strict):
    """The recording proxy for one target: its own port (clients point there instead of at
    vLLM; unset: `/proxy/<name>/` on the exporter's port only) and its waits on the upstream."""

    listen: Annotated[str, BeforeValidator(not_a_bare_port)] | None = None  # HOST:PORT
    connect_timeout: Duration = 10.0
    # A saturating benchmark's queued request waits minutes for its first byte.
    first_byte_timeout: Duration = 300.0
    idle_timeout: Duration = 120.0  # between two pieces of an answer
    # The header a client names its request's segment in (per_request.by.tag).
    tag_header: Annotated[str, AfterValidator(header_name)] = "X-Specdec-Tag"


class TargetConfig(_Strict):
    """One server to scrape: `url`, or `host` + `port` (AISBench's `host_ip`/`host_port` too)."""

    name: str = ""
    url: Annotated[_URL, BeforeValidator(implied_url)] = ""
    host: str = ""
    port: int | None = Field(default=None, ge=1, le=65535)
    scheme: str = "http"
    path: str = "/metrics"  # with host + port; TensorRT-LLM's default is /prometheus/metrics
    timeout: Duration | None = None
    headers: dict[str, str] = {}
    token_env: str | None = None
    tls_verify: bool = True
    ca_file: str | None = None
    labels: dict[str, str] = {}
    # A page over one of these is a failed scrape (up=0, the reason), as Prometheus's limits.
    series_limit: int = Field(default=20_000, ge=1)
    label_value_length_limit: int = Field(default=1024, ge=1)
    position_limit: int = Field(default=64, ge=1)
    # `auto` reads it off the page's first spec-decode name; name one to ignore other engines'.
    dialect: Dialect = Dialect.AUTO
    # A forward proxy for this target alone (http://host:port); unset: HTTP(S)_PROXY/NO_PROXY.
    proxy_url: Annotated[str, AfterValidator(lambda v: _check_url(v, ("http",)))] | None = None
    # `none` for loopback/LAN targets: inflating costs more CPU than a fast link saves.
    compression: Literal["gzip", "none"] = "gzip"
    # Ask for only the samples we read (`?name[]=`) where the target is proven to honour it.
    name_filter: bool = True
    # The recording proxy: `proxy.listen` forwards to `api_url`, default the metrics URL's origin.
    proxy: ProxyConfig | None = None
    api_url: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _aisbench_words(cls, data: Any) -> Any:
        # AISBench model configs say host_ip/host_port/enable_ssl; accept them as synonyms.
        if isinstance(data, str):  # a bare `- 127.0.0.1:8000` is its url
            return {"url": implied_url(data)}
        if not isinstance(data, dict):
            raise ValueError("must be host:port, or a mapping such as {name: a, url: "
                             f"http://10.0.0.1:8080/metrics}}, not {data!r}")
        data = dict(data)
        for alias, key in (("host_ip", "host"), ("host_port", "port")):
            if alias in data:
                if key in data:
                    raise ValueError(f"give {key} or {alias}, not both")
                data[key] = data.pop(alias)
        if "enable_ssl" in data:
            data.setdefault("scheme", "https" if data.pop("enable_ssl") else "http")
        return data

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if value not in ("http", "https"):
            raise ValueError(f"must be http or https, not {value!r}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _LABEL_NAME.match(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a valid Prometheus label name")
            if name in _RESERVED_LABELS:
                raise ValueError(f"{name!r} is reserved by the exporter")
        return value

    @model_validator(mode="after")
    def _resolve(self) -> TargetConfig:
        if self.url and (self.host or self.port):
            raise ValueError("give url, or host and port, not both")
        if not self.url:
            if not self.host or self.port is None:
                raise ValueError("needs url, or host and port")
            host = f"[{self.host}]" if ":" in self.host else self.host
            if "path" not in self.model_fields_set:
                # trtllm-serve answers /metrics with JSON iteration stats, not Prometheus text.
                object.__setattr__(self, "path", default_path(self.dialect))
            path = self.path if self.path.startswith("/") else "/" + self.path
            object.__setattr__(self, "url", f"{self.scheme}://{host}:{self.port}{path}")
        if not self.name:
            object.__setattr__(self, "name", self.host_port)
        sets_auth = self.token_env or any(h.lower() == "authorization" for h in self.headers)
        if "@" in urlsplit(self.url).netloc and sets_auth:
            # aiohttp refuses the request at every scrape: say so once, here.
            raise ValueError("credentials in the url and an Authorization header (token_env or "
                             "headers) both set Authorization: give one")
        return self

    @property
    def page_limits(self) -> PageLimits:
        return PageLimits(self.series_limit, self.label_value_length_limit, self.position_limit)

    @property
    def display_url(self) -> str:
        """The URL as pages, the API and result files show it: credentials as `<secret>`."""
        return redact_url(self.url)

    @property
    def host_port(self) -> str:
        """`host:port` of the URL (`[::1]:8080`), the default name and the console title."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        # AISBench's label: an IPv6 host in brackets, so the port stays readable.
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FileSDConfig(_Strict):
    """Prometheus-style file discovery: JSON or YAML files of `[{targets, labels}]`."""

    files: list[str] = Field(min_length=1)  # glob patterns
    refresh_interval: Duration = 30.0


class HttpSDConfig(_Strict):
    """Prometheus-style HTTP discovery: a URL answering `[{targets, labels}]` as JSON."""

    url: _URL
    refresh_interval: Duration = 60.0
    headers: dict[str, str] = {}
    token_env: str | None = None


class PrometheusSDConfig(_Strict):
    """Targets from a Prometheus server's active targets (`/api/v1/targets`), by job and labels."""

    url: _URL  # the Prometheus server's base URL, e.g. http://prometheus:9090
    job: str | None = None  # only targets of this scrape job (scrape pool)
    matchers: list[str] = []  # PromQL-style, on the target's labels: namespace="llm"
    refresh_interval: Duration = 60.0
    headers: dict[str, str] = {}
    token_env: str | None = None

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_matcher(text)
        return value


class StoreAuth(_Strict):
    """The credentials one Prometheus-compatible store gets, and only that store."""

    token_env: str | None = None  # environment variable holding a bearer token
    username: str | None = None  # basic auth, the password from `password_env`
    password_env: str | None = None
    ca_file: str | None = None
    tenant: str | None = None  # X-Scope-OrgID (Mimir, Cortex)


class HistoryStore(StoreAuth):
    """A store a history request may name beside `history.prometheus`, with its own credentials."""

    url: _BaseURL

    @field_validator("url")
    @classmethod
    def _given(cls, value: str) -> str:
        if not value:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value


class HistoryConfig(StoreAuth):
    """The Prometheus-compatible store `POST /api/v1/windows/history` reads by default, and the
    other stores a request may name (each with only its own credentials)."""

    prometheus: _BaseURL | None = None  # Prometheus, Thanos, Mimir, VictoriaMetrics
    timeout: Duration = 30.0
    allowed_stores: list[HistoryStore] = []

    @model_validator(mode="after")
    def _one_entry_per_store(self) -> HistoryConfig:
        seen = {self.prometheus} if self.prometheus else set()
        for i, store in enumerate(self.allowed_stores):
            if store.url in seen:
                # Two entries for one URL would leave which credentials it gets to chance.
                raise _KeyError(f"allowed_stores.{i}.url",
                                f"{redact_url(store.url)} is listed already (history.prometheus "
                                "or an earlier entry): one entry per store")
            seen.add(store.url)
        return self

    def store_auth(self, url: str) -> StoreAuth | None:
        """The credentials configured for the store at `url`; None when it is not configured."""
        if url == self.prometheus:
            return self
        return next((s for s in self.allowed_stores if s.url == url), None)


class Config(_Strict):
    """The whole exporter configuration; replaced whole on reload."""

    listen: _HostPort = "127.0.0.1:9400"
    scrape_interval: Duration = 5.0
    scrape_timeout: Duration = 3.0  # unset: never past scrape_interval
    live_window: Duration = 60.0
    # Open windows' targets are scraped this often: a restart loses what came since the last.
    window_scrape_interval: Duration | None = None
    output_dir: str = "outputs"
    state_db: str | None = None  # default: <output_dir>/state.sqlite
    # Accepted, and ignored, so that configs written for older versions still load.
    state_save_interval: Duration | None = None
    max_response_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    scrape_concurrency: int = Field(default=64, ge=1, le=10000)
    max_open_windows: int = Field(default=1000, ge=1)
    # Stopped windows leave the state database (result files stay) this long after their start.
    window_retention: Annotated[float, BeforeValidator(parse_retention)] = 30 * 86400.0
    # A request head slower than this (from connect or last answer) is cut. Read at start.
    header_timeout: Duration = 10.0
    # Host names (or `*.example.org`) POSTs may be sent to, beside the listen host, localhost,
    # IP addresses, single-label and Kubernetes service names and our own: DNS rebinding.
    allowed_hosts: list[str] = []
    # Static plus discovered: past the default one exporter misses its beat; shard instead.
    max_targets: int = Field(default=DEFAULT_MAX_TARGETS, ge=1)
    shards: int = Field(default=1, ge=1)
    shard_index: int = Field(default=0, ge=0)
    # Every shard's base URL in shard_index order, this one's too: window calls fan out to all.
    peers: list[_BaseURL] = []
    auth: AuthConfig = AuthConfig()
    targets: list[TargetConfig] = []
    file_sd: list[FileSDConfig] = []
    http_sd: list[HttpSDConfig] = []
    prometheus_sd: list[PrometheusSDConfig] = []
    history: HistoryConfig = HistoryConfig()

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if "scrape_timeout" not in self.model_fields_set:
            # As Prometheus does: an unset timeout is capped by a shorter interval.
            object.__setattr__(self, "scrape_timeout", min(self.scrape_timeout,
                                                           self.scrape_interval))
        durations = [("scrape_timeout", self.scrape_timeout),
                     ("window_scrape_interval", self.window_scrape_interval)]
        durations += [(f"targets.{i}.timeout", t.timeout) for i, t in enumerate(self.targets)]
        for key, value in durations:
            if problem := _over_interval(value, self.scrape_interval):
                raise _KeyError(key, problem)
        if self.shard_index >= self.shards:
            raise _KeyError("shard_index", f"must be below shards ({self.shards})")
        if self.peers and len(self.peers) != self.shards:
            raise _KeyError("peers", f"must list every shard: {len(self.peers)} URL(s) for "
                                     f"shards={self.shards}")
        return self

    @property
    def window_interval(self) -> float:
        """How often an open window's targets are scraped: the key, else 1s within the interval."""
        return self.window_scrape_interval or min(1.0, self.scrape_interval)

    @property
    def state_path(self) -> Path:
        return Path(self.state_db) if self.state_db else Path(self.output_dir) / "state.sqlite"


def validate_config(data: Any, source: str = "<config>") -> Config:
    """A parsed YAML document -> `Config`, or `ConfigError` listing every problem at once."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top): must be a mapping of keys"])
    targets = data.get("targets")
    limit = data.get("max_targets", DEFAULT_MAX_TARGETS)
    if isinstance(targets, list) and isinstance(limit, int) and len(targets) > limit:
        # Before validating them: building far more than the limit takes seconds and memory.
        raise ConfigError(source, [
            f"targets: {len(targets)} targets is over max_targets ({limit}); raise "
            "max_targets if this is meant, or split the targets over shards"])
    problems: list[str] = []
    config = None
    try:
        data = clean_tree(data)
    except TextError as exc:
        raise ConfigError(source, [str(exc)]) from None
    except RecursionError:
        raise ConfigError(source, ["(top): nested too deeply"]) from None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems += [problem_line(e, data) for e in exc.errors()]
    # pydantic skips whole-model checks once a field fails: every problem is said in one run.
    problems += _cross_field_problems(data)
    problems = list(dict.fromkeys(problems))
    if problems or config is None:
        raise ConfigError(source, problems or ["(top): invalid"])
    return config


def _try_duration(value: Any, default: float) -> float | None:
    try:
        return default if value is None else parse_duration(value)
    except ValueError:
        return None


def _cross_field_problems(data: dict[str, Any]) -> list[str]:
    """Checks across keys on the raw document, skipping values that are wrong on their own."""
    problems = []
    interval = _try_duration(data.get("scrape_interval"), 5.0)
    # Unset, it follows a shorter scrape_interval (`Config._consistent`): no problem to say.
    timeout = _try_duration(data["scrape_timeout"], 0.0) if "scrape_timeout" in data else None
    window = _try_duration(data.get("window_scrape_interval"), 0.0)
    for key, value in (("scrape_timeout", timeout), ("window_scrape_interval", window)):
        if problem := _over_interval(value, interval):
            problems.append(f"{key}: {problem}")
    shards, index = data.get("shards", 1), data.get("shard_index", 0)
    if type(shards) is int and type(index) is int and 0 <= index and index >= shards >= 1:
        problems.append(f"shard_index: must be below shards ({shards})")
    targets = data.get("targets")
    seen: dict[str, int] = {}
    for position, raw in enumerate(targets if isinstance(targets, list) else []):
        # A target with problems of its own (listed already) may still have a duplicate name.
        target = _valid_target(raw) or _identity(raw)
        if target is None:
            continue
        if problem := _over_interval(target.timeout, interval):
            problems.append(f"targets.{position}.timeout: {problem}")
        if target.name in seen:
            problems.append(f'targets.{position}.name: duplicate target name "{target.name}"'
                            f" (also targets.{seen[target.name]})")
        seen.setdefault(target.name, position)
    return problems


_IDENTITY_KEYS = ("name", "url", "host", "port", "host_ip", "host_port", "scheme", "enable_ssl",
                  "path", "dialect")


def _valid_target(raw: Any) -> TargetConfig | None:
    try:
        return TargetConfig.model_validate(raw)
    except ValidationError:
        return None


def _identity(raw: Any) -> TargetConfig | None:
    """A target that fails validation, made of only the keys that name it, or None."""
    if not isinstance(raw, dict):
        return None
    return _valid_target({k: v for k, v in raw.items() if k in _IDENTITY_KEYS})


def load_config(
    path: str | Path, overrides: dict[str, Any] | None = None, *, allow_empty: bool = False
) -> Config:
    """Read and validate a YAML config file; `overrides` (top-level keys) win over the file's.
    No targets and no discovery is refused unless `allow_empty`: it is a file caught mid-write."""
    source = str(path)
    try:
        text = read_text(Path(path), MAX_CONFIG_BYTES)
    except DocumentError as exc:
        if str(exc).startswith("over "):
            raise ConfigError(source, [f"(file): {exc} (1 MiB); put large target lists in "
                                       "file_sd or http_sd"]) from None
        raise ConfigError(source, [f"(file): {exc}"]) from None
    try:
        data = parse_yaml(text)
    except DocumentError as exc:
        raise ConfigError(source, [f"(yaml): {exc}"]) from None
    if overrides and (data is None or isinstance(data, dict)):
        data = (data or {}) | overrides
    config = validate_config(data, source)
    if not allow_empty and not (config.targets or config.file_sd or config.http_sd
                                or config.prometheus_sd):
        problem = "(file): empty" if not text.strip() else "targets: no targets and no discovery"
        raise ConfigError(source, [
            f"{problem}: refused so that a file caught mid-write does not drop every target "
            "(check-config --allow-empty accepts it)"])
    return config


def check_reload(old: Config, new: Config, source: str) -> None:
    """What a reload cannot change while we run: `ConfigError` saying so."""
    if new.listen != old.listen:
        raise ConfigError(source, [
            f"listen: changed from {old.listen} to {new.listen}: the listening socket is "
            "bound at start, restart the exporter to move it"])
