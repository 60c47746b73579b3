"""The collapse alerts against a real Prometheus: two fake vLLM servers behind the exporter and
its recording proxies, one of them collapsing mid-run.

Prometheus evaluates deploy/prometheus/rules.yml with its windows shortened (5m to 10s, 6h to
60s, the alerts' `for:` 3s: alertstack.render_rules); the expressions and thresholds are the
shipped file's. SpecDecAcceptanceCollapse and SpecDecAcceptanceSplit fire for the collapsing
server and for no other (ALERTS, read from Prometheus's API).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from alertstack import ALERTS, Prometheus, http, launch, render_rules, repeating, wait
from conftest import free_port, tool

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

FAKES = {"steady": "11", "collapsing": "12"}  # name: seed
# 300 drafts a second: 3,000 in the 10s window, past the collapse alert's 1,000.
FAKE_ARGS = ["--k", "3", "--acceptance", "0.8", "--drafts-per-second", "300",
             "--per-request-spec-decode-metrics", "summary"]
CLI = [sys.executable, "-m", "exporter"]


def _exporter_config(path: Path, ports: dict[str, int]) -> Path:
    path.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['exporter']}",
        "scrape_interval": "1s", "scrape_timeout": "800ms",
        "output_dir": str(path.parent / "results"),
        "targets": [{"name": name, "url": f"http://127.0.0.1:{ports[name]}/metrics",
                     "proxy": {"listen": f"127.0.0.1:{ports[f'proxy-{name}']}"}}
                    for name in FAKES],
    }))
    return path


def test_collapse_fires_for_the_collapsing_server_only(tmp_path):
    ports = {name: free_port() for name in
             [*FAKES, *(f"proxy-{n}" for n in FAKES), "exporter", "prometheus"]}
    sent: dict[str, list[int]] = {name: [] for name in FAKES}

    def send() -> None:  # one completion through each recording proxy
        for name in FAKES:
            status, _ = http(f"http://127.0.0.1:{ports[f'proxy-{name}']}/v1/completions",
                             {"model": "m", "prompt": "p", "max_tokens": 24})
            sent[name].append(status)

    prom = Prometheus(tool("prometheus"), ports["prometheus"], tmp_path)
    with ExitStack() as stack:
        for name, seed in FAKES.items():
            stack.enter_context(launch(name, [*CLI, "fake-vllm", "--port", str(ports[name]),
                                              "--seed", seed, *FAKE_ARGS], tmp_path))
        config = _exporter_config(tmp_path / "exporter.yaml", ports)
        stack.enter_context(launch("exporter", [*CLI, "serve", "--config", str(config)],
                                   tmp_path))
        wait("exporter /-/ready", lambda: http(
            f"http://127.0.0.1:{ports['exporter']}/-/ready")[0] == 200, 30, tmp_path)
        stack.enter_context(prom.running(ports["exporter"], render_rules(
            tmp_path / "rules.yml", short=10, long=60)))
        errors = stack.enter_context(repeating(send, 0.2))  # about 5 a second to each

        # Both healthy, with enough evidence and a baseline: no collapse alert, not even pending.
        healthy = (
            "specdec_target:drafts:increase5m >= 1000"
            " and specdec_target:requests:increase5m >= 20"
            " and specdec_target:acceptance_length:increase6h >= 2")
        wait("both targets healthy with evidence",
             lambda: set(prom.query(healthy)) == set(FAKES), 30, tmp_path)
        assert prom.alerts() == set()

        status, body = http(f"http://127.0.0.1:{ports['collapsing']}/control/acceptance",
                            {"acceptance": 0.0})
        assert status == 200, body
        expected = {(alert, "collapsing") for alert in ALERTS}
        wait("both alerts firing for the collapsing server",
             lambda: prom.alerts("firing") >= expected, 40, tmp_path)
        assert prom.alerts() == expected  # nothing for the steady server, pending or firing

        # What the alerts saw: nothing accepted at all, by the counters and by every request.
        lengths = prom.query("specdec_target:acceptance_length:rate5m")
        assert lengths["collapsing"] == 1.0 and lengths["steady"] > 2, lengths
        shares = prom.query("specdec_target:requests_nothing_accepted_ratio:increase5m")
        assert shares["collapsing"] == 1.0 and shares["steady"] < 0.2, shares
    assert errors == []
    assert all(set(statuses) == {200} and len(statuses) >= 20 for statuses in sent.values()), {
        name: (len(s), set(s)) for name, s in sent.items()}
