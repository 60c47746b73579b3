"""Config: every invalid file maps to its exact `key.path: what is wrong` lines; valid ones load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config.model import Config, load_config, validate_config
from exporter.config.values import parse_duration
from exporter.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "testdata" / "config"

INVALID = {
    "invalid-unknown-top-key.yaml": ["scrape_intervall: unknown key"],
    "invalid-unknown-target-key.yaml": ["targets.0.ulr: unknown key"],
    "invalid-bad-duration.yaml": [
        "scrape_interval: must be a duration like 250ms, 5s or 1m, not '5x'"
    ],
    "invalid-negative-duration.yaml": ["scrape_interval: must be greater than 0"],
    "invalid-zero-duration.yaml": ["live_window: must be greater than 0"],
    "invalid-timeout-over-interval.yaml": [
        "scrape_timeout: must not be longer than scrape_interval (5s > 2s)"
    ],
    "invalid-url-scheme.yaml": [
        "targets.0.url: must be an http:// or https:// URL with a host, "
        "not 'ftp://10.0.0.1:8080/metrics'"
    ],
    "invalid-url-no-host.yaml": [
        "targets.0.url: must be an http:// or https:// URL with a host, not 'http:///metrics'"
    ],
    "invalid-url-bad-port.yaml": [
        "targets.0.url: has a bad port: 'http://10.0.0.1:99999/metrics'"
    ],
    "invalid-port.yaml": ["targets.0.port: must be greater than or equal to 1"],
    "invalid-duplicate-names.yaml": ['targets.2.name: duplicate target name "a" (also targets.0)'],
    "invalid-url-and-host.yaml": ["targets.0: give url, or host and port, not both"],
    "invalid-neither-url-nor-host.yaml": ["targets.0: needs url, or host and port"],
    "invalid-reserved-label.yaml": ["targets.0.labels: 'target' is reserved by the exporter"],
    "invalid-label-name.yaml": [
        "targets.0.labels: 'my-label' is not a valid Prometheus label name"
    ],
    "invalid-listen.yaml": ["listen: must be host:port, not 'localhost'"],
    "invalid-not-a-mapping.yaml": ["(top): must be a mapping of keys"],
    "invalid-yaml-syntax.yaml": [
        "(yaml): invalid YAML at line 4, column 9: mapping values are not allowed here"
    ],
    "invalid-proxy-url.yaml": [
        "targets.0.proxy_url: must be an http:// URL with a host, not 'socks5://10.0.0.9:1080'"
    ],
    "invalid-compression.yaml": ["targets.0.compression: must be 'gzip' or 'none'"],
    "invalid-shard-index.yaml": ["shard_index: must be below shards (2)"],
    "invalid-target-timeout-over-interval.yaml": [
        "targets.1.timeout: must not be longer than scrape_interval (60s > 5s)"
    ],
    "invalid-four-kinds.yaml": [
        "listen: must be host:port, not 'nohost'",
        "bogus: unknown key",
        "scrape_timeout: must not be longer than scrape_interval (5s > 1s)",
        'targets.1.name: duplicate target name "a" (also targets.0)',
    ],
    "invalid-as-written.yaml": [
        'listen: must be "HOST:PORT", not the port alone: e.g. "127.0.0.1:19420" (loopback '
        'only) or "0.0.0.0:19420" (every interface)',
        "targets.0.host_port: must be less than or equal to 65535",
        "targets.2.labels: 'target' is reserved by the exporter",
        "targets.3: must be an http:// or https:// URL, or host:port, not 'nohost'",
        "targets.4.url: must be an http:// or https:// URL, or host:port, not '10.0.0.4'",
        "targets.5: must be host:port, or a mapping such as {name: a, url: "
        "http://10.0.0.1:8080/metrics}, not 7",
        # A target with a problem of its own is still checked for a duplicate name.
        'targets.2.name: duplicate target name "b" (also targets.1)',
    ],
    "invalid-several.yaml": [
        "scrape_interval: must be a duration like 250ms, 5s or 1m, not '1 minute'",
        "targets.0.ulr: unknown key",
        "targets.1.port: must be less than or equal to 65535",
    ],
}


def _check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )


class TestInvalidFiles:
    def test_every_file_has_an_expectation(self):
        assert sorted(p.name for p in DATA.glob("invalid-*.yaml")) == sorted(INVALID)

    @pytest.mark.parametrize(("name", "problems"), sorted(INVALID.items()))
    def test_exact_problems(self, name, problems):
        with pytest.raises(ConfigError) as caught:
            load_config(DATA / name)
        assert caught.value.problems == problems
        assert caught.value.source == str(DATA / name)

    def test_missing_file(self, tmp_path):
        with pytest.raises(ConfigError) as caught:
            load_config(tmp_path / "nope.yaml")
        missing = tmp_path / "nope.yaml"
        assert caught.value.problems == [
            f"(file): cannot read {missing}: No such file or directory"
        ]


class TestValidFiles:
    @pytest.mark.parametrize("name", ["exporter.yaml", "demo.yaml"])
    def test_shipped_configs_load(self, name):
        config = load_config(ROOT / "config" / name)
        assert isinstance(config, Config)
        assert config.targets
        assert len({t.name for t in config.targets}) == len(config.targets)

    def test_shipped_exporter_yaml(self):
        config = load_config(ROOT / "config" / "exporter.yaml")
        assert config.listen == "127.0.0.1:9400"
        assert (config.scrape_interval, config.scrape_timeout, config.live_window) == (5, 3, 60)
        first, second = config.targets
        assert first.labels == {"cluster": "a"}
        assert second.url == "http://127.0.0.1:8001/metrics"

    def test_empty_file_is_all_defaults(self, tmp_path):
        path = tmp_path / "empty.yaml"
        path.write_text("")
        config = load_config(path, allow_empty=True)
        assert config.targets == [] and config.listen == "127.0.0.1:9400"
        assert config.max_response_bytes == 16 * 1024 * 1024


class TestDuration:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [("250ms", 0.25), ("5s", 5.0), ("1m", 60.0), ("1h", 3600.0), ("1.5s", 1.5), (2, 2.0),
         (0.5, 0.5), (" 10s ", 10.0)],
    )
    def test_parses(self, text, seconds):
        assert parse_duration(text) == seconds

    @pytest.mark.parametrize(
        ("value", "message"),
        [("5x", "must be a duration like 250ms, 5s or 1m, not '5x'"),
         ("-1s", "must be a duration like 250ms, 5s or 1m, not '-1s'"),
         ("", "must be a duration like 250ms, 5s or 1m, not ''"),
         (True, "must be a duration like 250ms, 5s or 1m"),
         (0, "must be greater than 0"), ("0ms", "must be greater than 0"),
         (-3, "must be greater than 0")],
    )
    def test_refuses(self, value, message):
        with pytest.raises(ValueError) as caught:
            parse_duration(value)
        assert str(caught.value) == message


def _target(**fields):
    return validate_config({"targets": [fields]}).targets[0]


class TestTarget:
    @pytest.mark.parametrize(
        ("fields", "url", "name"),
        [
            ({"url": "http://10.0.0.1:8080/metrics"}, "http://10.0.0.1:8080/metrics",
             "10.0.0.1:8080"),
            ({"url": "https://vllm.example/metrics"}, "https://vllm.example/metrics",
             "vllm.example:443"),
            ({"host": "10.0.0.1", "port": 8080}, "http://10.0.0.1:8080/metrics", "10.0.0.1:8080"),
            # host:port alone, as on the command line: http:// and /metrics implied
            ({"url": "127.0.0.1:8000"}, "http://127.0.0.1:8000/metrics", "127.0.0.1:8000"),
            ({"url": "h:9/stats"}, "http://h:9/stats", "h:9"),
            ({"host_ip": "10.0.0.2", "host_port": 8081}, "http://10.0.0.2:8081/metrics",
             "10.0.0.2:8081"),
            ({"host_ip": "10.0.0.2", "host_port": "8081", "enable_ssl": True},
             "https://10.0.0.2:8081/metrics", "10.0.0.2:8081"),
            ({"host_ip": "10.0.0.2", "host_port": 8081, "enable_ssl": False},
             "http://10.0.0.2:8081/metrics", "10.0.0.2:8081"),
            ({"host": "h", "port": 9, "scheme": "https", "path": "stats"}, "https://h:9/stats",
             "h:9"),
            # AISBench's label: IPv6 hosts in brackets
            ({"host": "::1", "port": 8000}, "http://[::1]:8000/metrics", "[::1]:8000"),
            ({"name": "mine", "url": "http://[fe80::1]:8000/metrics"},
             "http://[fe80::1]:8000/metrics", "mine"),
        ],
    )
    def test_url_and_default_name(self, fields, url, name):
        target = _target(**fields)
        assert (target.url, target.name) == (url, name)

    def test_per_target_options(self):
        target = _target(
            name="t", url="https://h:1/metrics", timeout="750ms", headers={"X-Tenant": "b"},
            token_env="VLLM_API_KEY", tls_verify=False, ca_file="/ca.pem", labels={"zone": "z"},
        )
        assert target.timeout == 0.75 and target.headers == {"X-Tenant": "b"}
        assert target.token_env == "VLLM_API_KEY" and target.tls_verify is False
        assert target.ca_file == "/ca.pem" and target.labels == {"zone": "z"}

    def test_frozen(self):
        target = _target(url="http://h:1/metrics")
        with pytest.raises(ValueError):
            target.url = "http://other:1/metrics"

    @pytest.mark.parametrize(
        ("fields", "problem"),
        [
            ({"host": "h", "host_ip": "h", "port": 1}, "targets.0: give host or host_ip, not both"),
            ({"host": "h", "port": 1, "scheme": "ftp"},
             "targets.0.scheme: must be http or https, not 'ftp'"),
            ({"url": "http://h:1/", "labels": {"__x": "y"}},
             "targets.0.labels: '__x' is not a valid Prometheus label name"),
            ({"url": "http://h:1/", "labels": {"position": "y"}},
             "targets.0.labels: 'position' is reserved by the exporter"),
            ({"url": "http://h:1/", "timeout": "fast"},
             "targets.0.timeout: must be a duration like 250ms, 5s or 1m, not 'fast'"),
            ({"url": "http://h:1/", "dialect": "tgi"},
             "targets.0.dialect: must be 'auto', 'vllm', 'llamacpp', 'sglang' or 'trtllm'"),
        ],
    )
    def test_problems(self, fields, problem):
        with pytest.raises(ConfigError) as caught:
            validate_config({"targets": [fields]})
        assert caught.value.problems == [problem]


class TestConfig:
    def test_default_names_collide(self):
        with pytest.raises(ConfigError) as caught:
            validate_config({"targets": [{"host": "h", "port": 1}, {"url": "http://h:1/x"}]})
        assert caught.value.problems == [
            'targets.1.name: duplicate target name "h:1" (also targets.0)'
        ]

    def test_a_bare_host_port_is_a_target(self):
        config = validate_config({"targets": ["127.0.0.1:8000", "[::1]:8001/stats"]})
        assert [(t.name, t.url) for t in config.targets] == [
            ("127.0.0.1:8000", "http://127.0.0.1:8000/metrics"),
            ("[::1]:8001", "http://[::1]:8001/stats")]

    @pytest.mark.parametrize(("fields", "timeout"), [
        ({"scrape_interval": 1}, 1.0),  # unset: capped by the interval, as Prometheus does
        ({"scrape_interval": "10s"}, 3.0),
        ({"scrape_interval": "10s", "scrape_timeout": "8s"}, 8.0),
    ])
    def test_an_unset_scrape_timeout_follows_a_shorter_interval(self, fields, timeout):
        assert validate_config(fields).scrape_timeout == timeout

    def test_state_path_defaults_under_output_dir(self):
        assert str(validate_config({"output_dir": "o"}).state_path) == "o/state.sqlite"
        assert str(validate_config({"state_db": "/s.db"}).state_path) == "/s.db"


@pytest.mark.e2e
class TestCheckConfigCommand:
    @pytest.mark.parametrize("name", ["exporter.yaml", "demo.yaml"])
    def test_valid_exits_0(self, name):
        done = _check_config(ROOT / "config" / name)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ok" in done.stdout

    @pytest.mark.parametrize(
        "name", ["invalid-several.yaml", "invalid-duplicate-names.yaml", "invalid-yaml-syntax.yaml",
                 "invalid-as-written.yaml"]
    )
    def test_invalid_exits_1_one_line_per_problem(self, name):
        done = _check_config(DATA / name)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.splitlines() == INVALID[name]
