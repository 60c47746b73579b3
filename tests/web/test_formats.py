"""/metrics in text or OpenMetrics, gzipped or not: negotiation, the rewrite, real scrapers."""

from __future__ import annotations

import gzip
import json
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from clitools import CLI, fake_add, fake_vllm, free_port, process, wait_http, write_config
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.web.formats import (
    OPENMETRICS_TYPE,
    TEXT_TYPE,
    Format,
    accepts_gzip,
    gzipped,
    negotiate,
)

OM1 = OPENMETRICS_TYPE.format(version="1.0.0")
OM001 = OPENMETRICS_TYPE.format(version="0.0.1")
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def _samples(families) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families for s in f.samples}


class TestNegotiate:
    @pytest.mark.parametrize("accept, expected", [
        (PROMETHEUS_ACCEPT, (Format.OPENMETRICS, OM1)),
        ("application/openmetrics-text", (Format.OPENMETRICS, OM1)),
        ("application/openmetrics-text; version=0.0.1", (Format.OPENMETRICS, OM001)),
        ("text/plain;version=0.0.4;q=0.9, application/openmetrics-text;q=0.5",
         (Format.TEXT, TEXT_TYPE)),
        ("application/openmetrics-text;version=2.0.0", (Format.TEXT, TEXT_TYPE)),
        ("application/openmetrics-text;q=0", (Format.TEXT, TEXT_TYPE)),
        ("application/openmetrics-text;q=abc", (Format.TEXT, TEXT_TYPE)),
        ("text/plain", (Format.TEXT, TEXT_TYPE)),
        ("*/*", (Format.TEXT, TEXT_TYPE)),
        ("", (Format.TEXT, TEXT_TYPE)),
        (None, (Format.TEXT, TEXT_TYPE)),
        (",,;;", (Format.TEXT, TEXT_TYPE)),
    ])
    def test_accept(self, accept, expected):
        assert negotiate(accept) == expected

    def test_format_parameter_wins(self):
        assert negotiate(PROMETHEUS_ACCEPT, "text") == (Format.TEXT, TEXT_TYPE)
        assert negotiate(None, "openmetrics") == (Format.OPENMETRICS, OM1)
        with pytest.raises(ValueError, match="format must be text or openmetrics, not 'json'"):
            negotiate(None, "json")

    @pytest.mark.parametrize("header, expected", [
        ("gzip", True), ("deflate, gzip;q=0.5", True), ("*", True), ("gzip;q=0", False),
        ("identity", False), ("", False), (None, False), ("br, deflate", False),
    ])
    def test_accepts_gzip(self, header, expected):
        assert accepts_gzip(header) is expected


TEXT = b"""\
# HELP specdec_build_info Version of specdec-exporter; always 1.
# TYPE specdec_build_info gauge
specdec_build_info{version="0.1.0"} 1.0
# HELP specdec_drafts_total Spec-decode drafts, with \\\\ and a \\n in the help.
# TYPE specdec_drafts_total counter
specdec_drafts_total{model_name="m",target="a"} 12.0
specdec_drafts_total{model_name="m",target="b \\"quoted\\""} 3.0
# HELP specdec_drafts_total_ratio A gauge whose name starts like the counter's.
# TYPE specdec_drafts_total_ratio gauge
specdec_drafts_total_ratio 0.5
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.25
# HELP specdec_acceptance_ratio Ratio.
# TYPE specdec_acceptance_ratio gauge
specdec_acceptance_ratio{target="a"} NaN
"""


class TestGzip:
    def test_gzip_is_deterministic(self):
        assert gzipped(TEXT) == gzipped(TEXT)
        assert gzip.decompress(gzipped(TEXT)) == TEXT


class TestMetricsEndpoint:
    async def _exporter(self, exporter, fake_vllm):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url,
                                           "labels": {"cluster": "c1"}}]})
        await exp.round()
        return exp

    async def _get(self, exp, **headers):
        response = await exp.client.get("/metrics", headers=headers)
        return response, await response.read()

    async def test_openmetrics_when_asked(self, exporter, fake_vllm):
        exp = await self._exporter(exporter, fake_vllm)
        response, body = await self._get(exp, Accept=PROMETHEUS_ACCEPT,
                                         **{"Accept-Encoding": "identity"})
        assert response.headers["Content-Type"] == OM1
        assert "Content-Encoding" not in response.headers
        assert body.endswith(b"\n# EOF\n")
        families = {f.name: f for f in parse_om(body.decode())}
        assert families["specdec_drafts"].type == "counter"
        assert families["specdec_scrape_errors"].type == "counter"
        _, text = await self._get(exp, Accept="text/plain", **{"Accept-Encoding": "identity"})
        assert _samples(families.values()).keys() == _samples(parse_text(text.decode())).keys()

    async def test_text_by_default_and_by_parameter(self, exporter, fake_vllm):
        exp = await self._exporter(exporter, fake_vllm)
        response, body = await self._get(exp, **{"Accept-Encoding": "identity"})
        assert response.headers["Content-Type"] == TEXT_TYPE
        assert b"# TYPE specdec_drafts_total counter" in body and b"# EOF" not in body
        response = await exp.client.get("/metrics?format=text",
                                         headers={"Accept": PROMETHEUS_ACCEPT})
        assert response.headers["Content-Type"] == TEXT_TYPE
        response = await exp.client.get("/metrics?format=yaml")
        assert response.status == 400
        assert (await response.json())["error"] == (
            "format must be text or openmetrics, not 'yaml'")

    @pytest.mark.parametrize("accept", ["text/plain", PROMETHEUS_ACCEPT])
    async def test_gzip_when_asked(self, exporter, fake_vllm, accept):
        exp = await self._exporter(exporter, fake_vllm)
        response, plain = await self._get(exp, Accept=accept, **{"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in response.headers
        response, unpacked = await self._get(exp, Accept=accept,
                                             **{"Accept-Encoding": "gzip, deflate"})
        assert response.headers["Content-Encoding"] == "gzip"
        assert "Accept-Encoding" in response.headers["Vary"]
        assert unpacked == plain  # the test client inflates; the bytes on the wire were gzip
        assert int(response.headers["Content-Length"]) < len(plain) / 3

    @pytest.mark.e2e
    async def test_promtool_check_metrics_finds_nothing(self, exporter, fake_vllm, promtool):
        exp = await self._exporter(exporter, fake_vllm)
        _, text = await self._get(exp, **{"Accept-Encoding": "gzip"})
        proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.strip() == b"" and proc.stderr.strip() == b""


def _prom_query(url: str, expr: str) -> list[dict]:
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
        return json.loads(response.read())["data"]["result"]


@pytest.mark.e2e
@pytest.mark.prometheus
class TestRealPrometheusScrapes:
    def test_openmetrics_and_text_jobs_both_scrape_the_same_samples(self, tmp_path, prometheus):
        port, prom_port = free_port(), free_port()
        target = f"127.0.0.1:{port}"
        config = tmp_path / "prometheus.yml"
        # Prometheus asks for OpenMetrics first; the second job pins text with ?format=text.
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "om", "static_configs": [{"targets": [target]}]},
                {"job_name": "text", "params": {"format": ["text"]},
                 "static_configs": [{"targets": [target]}]},
            ]}))
        prom_url = f"http://127.0.0.1:{prom_port}"
        with fake_vllm("--k", "3") as vllm:
            fake_add(vllm, 10, 30, [8, 5, 2])
            exporter_config = write_config(tmp_path / "exporter.yaml", port, [
                {"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}])
            with process(CLI + ["serve", "--config", str(exporter_config)]), \
                    process([prometheus, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]):
                wait_http(f"http://{target}/-/ready")
                wait_http(f"{prom_url}/-/ready", deadline=30)
                deadline = time.monotonic() + 30
                while True:
                    drafts = {r["metric"]["job"]: float(r["value"][1]) for r in _prom_query(
                        prom_url, 'specdec_drafts_total{target="a"}')}
                    up = {r["metric"]["job"]: r["value"][1] for r in _prom_query(prom_url, "up")}
                    if len(drafts) == 2 or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                samples = {r["metric"]["job"]: float(r["value"][1]) for r in _prom_query(
                    prom_url, "scrape_samples_scraped")}
                types = {r["metric"]["job"]: r["metric"].get("__name__") for r in _prom_query(
                    prom_url, 'specdec_accepted_tokens_per_position_total{position="2"}')}
        assert up == {"om": "1", "text": "1"}, up
        assert drafts == {"om": 10.0, "text": 10.0}, drafts
        assert set(types) == {"om", "text"}, types
        # Same families both ways (process metrics may add or drop a sample between scrapes).
        assert abs(samples["om"] - samples["text"]) <= 2, samples
