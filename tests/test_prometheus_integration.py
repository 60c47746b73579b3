"""Proof against a real Prometheus: fake servers, the exporter and `prometheus` as subprocesses.

Prometheus scrapes the exporter every second with `deploy/prometheus/rules.yml` loaded. The
test runs a window through the exporter's HTTP API, then asks Prometheus's HTTP API for every
panel query of the dashboard, every recording rule, and numbers that must agree with the
exporter's own stop answer. `promtool check rules deploy/prometheus/rules.yml` is
tests/test_deploy_artifacts.py::TestPrometheusRules::test_check_rules; not repeated here.

Nothing is excused: the scrape-error panel and "targets up" have a target on a closed port, the
"windows open" annotation is checked over the window's span, and the day-before baseline rules
(`rate1d_offset30m`) get a synthetic history backfilled with `promtool tsdb create-blocks-from`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import free_port, tool

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "specdec-exporter.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"

TOKEN = "integration-token"
JOB = "specdec-exporter"
TRAFFIC_SECONDS = 10.0
# The baseline groups of rules.yml run every 1m, and Prometheus delays a group's first
# evaluation by up to one interval (hash-slotted): its records may take ~60 s to appear, and
# the first evaluation that sees live counters up to 60 s after they reached Prometheus (the
# proxied requests' second round, ~10 s after the start, up to 60 s after that).
BASELINE_GROUP_WAIT = 80.0
# Fake servers: name -> fake-vllm arguments. Different k, one with two engines, k = 12 so
# positions "10" and "11" exist (text order would put them before "2").
FAKES = {
    "k5": ["--k", "5", "--acceptance", "0.8", "--drafts-per-second", "30", "--seed", "1",
           "--per-request-spec-decode-metrics", "summary"],  # behind the recording proxy
    "k3dp2": ["--k", "3", "--engines", "2", "--acceptance", "0.6", "--drafts-per-second", "30",
              "--model-name", "fake/qwen-7b", "--seed", "2"],
    # Acceptance 0.7 at k=12: positions 9 to 11 accept nothing (p ~ 3e-9 per draft).
    "k12": ["--k", "12", "--acceptance", "0.7", "--drafts-per-second", "20", "--seed", "3"],
}
CLUSTER = "it-east"  # a target label the dashboard's cluster variable must find
PROM_CLUSTER = "prom-side"  # Prometheus's own target label: only where a series has none
DOWN = "down"  # a target on a closed port: target_up 0, scrape errors growing
# Synthetic history for the day-before baseline: these counters end HISTORY_END_AGO seconds
# ago, inside rate30m's range but outside every 5m / 1m range the other checks use.
HISTORY_TARGET = "history"
HISTORY_START_AGO = 3 * 3600
HISTORY_END_AGO = 20 * 60
HISTORY_RATIO = 0.5

# Dashboard queries that may legitimately return nothing, with the reason. Empty on purpose.
EXCUSED_QUERIES: dict[str, str] = {}


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for(what: str, probe, timeout: float, *, interval: float = 0.25, procs=()):
    """Poll `probe()` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        for proc in procs:
            if proc.popen.poll() is not None:
                pytest.fail(f"{proc.name} exited with {proc.popen.returncode} while waiting "
                            f"for {what}:\n{_tail(proc.log)}")
        try:
            result = probe()
        except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError
            result, last = None, exc
        else:
            last = result
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def _http(method: str, url: str, *, body: dict | None = None, token: str | None = None,
          timeout: float = 10.0) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class Proc:
    """One subprocess of the stack, its log file, and how to end it."""

    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


@dataclass
class Stack:
    """Everything running, plus the window the fixture recorded."""

    dir: Path
    prometheus_config: Path
    exporter_url: str
    prometheus_url: str
    prometheus_started: float  # time.monotonic() at launch
    live_data_at: float  # time.monotonic() when Prometheus had two scrapes with counters
    exporter: Proc
    procs: list[Proc]
    targets: list[str]  # exporter target names, DOWN included
    window: dict = field(default_factory=dict)  # the stop answer
    window_started: float = 0.0  # wall clock
    window_stopped: float = 0.0

    def query(self, expr: str, at: float | str | None = None) -> list[dict]:
        """Instant query; the result list (status success required)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        return self._api("query", params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        return self._api("query_range", params)["result"]

    def _api(self, path: str, params: dict) -> dict:
        url = f"{self.prometheus_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        status, body = _http("GET", url)
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params!r} answered {status}: {body!r}")
        return body["data"]

    def api_get(self, path: str, **params) -> dict | list:
        return self._api(path, params)

    @property
    def target_regex(self) -> str:
        return "|".join(self.targets)


def _backfill_history(tsdb: Path, work: Path) -> None:
    """Counters of a synthetic target, hours old, so the day-before baseline rules have data."""
    now = int(time.time())
    lines = []
    for name, per_minute, base in (("specdec_draft_tokens_total", 100, 1e6),
                                   ("specdec_accepted_tokens_total", 100 * HISTORY_RATIO, 5e5)):
        series = f'{name}{{job="backfill",target="{HISTORY_TARGET}",model_name="fake/history"}}'
        for i, ts in enumerate(range(now - HISTORY_START_AGO, now - HISTORY_END_AGO + 1, 60)):
            lines.append(f"{series} {base + per_minute * i} {ts}")
    source = work / "history.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(source), str(tsdb)], check=True, capture_output=True, timeout=60)


def _launch(name: str, cmd: list[str], work: Path, env: dict | None = None) -> Proc:
    log = work / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    return Proc(name, popen, log)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Fake servers, exporter, Prometheus; one window recorded; everything killed afterwards."""
    prometheus = tool("prometheus")
    tool("promtool")  # the history is backfilled with it
    work = tmp_path_factory.mktemp("prom-it")
    ports = {name: free_port() for name in [*FAKES, DOWN, "exporter", "prometheus", "proxy"]}
    exporter_url = f"http://127.0.0.1:{ports['exporter']}"
    prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"

    exporter_config = work / "exporter.yaml"
    exporter_config.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['exporter']}",
        "scrape_interval": "1s",
        "scrape_timeout": "800ms",
        "live_window": "15s",
        "output_dir": str(work / "results"),
        "auth": {"token_env": "SPECDEC_TOKEN"},
        "targets": [
            *({"name": name, "url": f"http://127.0.0.1:{ports[name]}/metrics",
               "labels": {"pool": "it", "cluster": CLUSTER},
               **({"proxy": {"listen": f"127.0.0.1:{ports['proxy']}"}} if name == "k5" else {})}
              for name in FAKES),
            {"name": DOWN, "url": f"http://127.0.0.1:{ports[DOWN]}/metrics"},
        ],
    }, sort_keys=False))
    prometheus_config = work / "prometheus.yml"
    prometheus_config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        # As deploy/prometheus/prometheus.yml: a `cluster` target label, honor_labels on.
        "scrape_configs": [{
            "job_name": JOB,
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{ports['exporter']}"],
                                "labels": {"cluster": PROM_CLUSTER}}],
        }],
    }, sort_keys=False))
    tsdb = work / "tsdb"
    _backfill_history(tsdb, work)

    # The environment must not reshape the exporter (SPECDEC_LISTEN, shards...): only our token.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    env["SPECDEC_TOKEN"] = TOKEN
    cli = [sys.executable, "-m", "exporter"]
    procs: list[Proc] = []
    try:
        # Prometheus first: its rule groups' first evaluations are slotted from its start.
        procs.append(_launch("prometheus", [
            prometheus, f"--config.file={prometheus_config}", f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn",
        ], work))
        prometheus_started = time.monotonic()
        for name, args in FAKES.items():
            procs.append(_launch(name, [*cli, "fake-vllm", "--port", str(ports[name]), *args],
                                 work, env))
        exporter = _launch("exporter", [*cli, "serve", "--config", str(exporter_config)],
                           work, env)
        procs.append(exporter)
        st = Stack(work, prometheus_config, exporter_url, prometheus_url, prometheus_started,
                   prometheus_started, exporter, procs, [*FAKES, DOWN])

        def ready(url: str):
            return lambda: _http("GET", f"{url}/-/ready", timeout=2)[0] == 200

        for name in FAKES:
            _wait_for(f"fake-vllm {name}",
                      lambda n=name: _http("GET", f"http://127.0.0.1:{ports[n]}/metrics",
                                           timeout=2)[0] == 200,
                      30, procs=procs)
        _wait_for("exporter /-/ready", ready(exporter_url), 30, procs=procs)
        _wait_for("prometheus /-/ready", ready(prometheus_url), 30, procs=procs)
        # Two scrapes with spec-decode counters in Prometheus before the window opens.
        _wait_for("two Prometheus scrapes of the exporter with counters", lambda: st.query(
            f'count_over_time(specdec_drafts_total{{job="{JOB}",target="k5"}}[1m]) >= 2'),
            30, procs=procs)
        st.live_data_at = time.monotonic()

        status, started = _http("POST", f"{exporter_url}/api/v1/windows", token=TOKEN,
                                body={"id": "it-window", "name": "integration"})
        assert status == 201, started
        assert sorted(started["targets"]) == sorted(st.targets)
        st.window_started = started["started_at"]
        # Requests through k5's recording proxy, in two rounds: Prometheus sees the histogram's
        # series from the first scrape after the first round, so only the second round is an
        # increase (the collapse panels and rules divide by it).
        for _ in range(2):
            for max_tokens in (8, 32, 64):
                status, _ = _http("POST", f"http://127.0.0.1:{ports['proxy']}/v1/completions",
                                  body={"model": "m", "prompt": "p", "max_tokens": max_tokens})
                assert status == 200
            time.sleep(TRAFFIC_SECONDS / 2)  # the fakes' background traffic flows meanwhile
        status, answer = _http("POST", f"{exporter_url}/api/v1/windows/it-window/stop",
                               token=TOKEN)
        assert status == 200, answer
        st.window = answer
        st.window_stopped = answer["stopped_at"]
        # Prometheus has scraped the exporter after the stop.
        _wait_for("specdec_last_window_info of the window in Prometheus",
                  lambda: st.query('specdec_last_window_info{id="it-window"}'), 15, procs=procs)
        yield st
    finally:
        for proc in reversed(procs):
            proc.stop()


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # rows, collapsed or not


def _panel_queries() -> list[tuple[str, str]]:
    return [(f"{panel.get('title')} [{t.get('refId')}]", t["expr"])
            for panel in _panels(_dashboard()["panels"])
            for t in panel.get("targets", []) if t.get("expr")]


def _substitute(expr: str, target_regex: str) -> str:
    values = {
        "target": target_regex, "model_name": ".*", "__rate_interval": "1m",
        "job": JOB, "instance": ".*", "cluster": ".*",
        "__interval": "15s", "__range": "5m", "datasource": "prometheus",
    }
    # Longest names first: $__range must not eat the start of $__rate_interval.
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    # `$1` is label_replace's capture group, not a dashboard variable.
    assert not re.search(r"\$[A-Za-z_{]", expr), f"unsubstituted variable in {expr!r}"
    return expr


def _values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def _one(result: list[dict], what: str) -> float:
    assert len(result) == 1, f"{what}: expected one series, got {result!r}"
    return float(result[0]["value"][1])


def _close(a: float, b: float, tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


class TestAgainstRealPrometheus:
    """Dashboard, rules and numbers; the fleet comparison stops the exporter, so it runs last."""

    def test_generated_config_passes_promtool(self, stack, promtool):
        proc = subprocess.run([promtool, "check", "config", str(stack.prometheus_config)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_window_stop_answer(self, stack):
        results = stack.window["results"]
        assert set(results) == set(stack.targets)
        for name in FAKES:
            data = results[name]["data"]
            assert results[name]["status"] == "ok", results[name]
            assert data["num_drafts"] > 0 and data["draft_tokens"] > 0
        assert results["k3dp2"]["engines"] == 2
        assert results[DOWN]["status"] == "na"
        assert results[DOWN]["error"].startswith("Failed to fetch metrics from")
        assert stack.window["aggregate"]["status"] == "ok"

    def test_every_dashboard_panel_query_returns_data(self, stack):
        queries = _panel_queries()
        assert len(queries) >= 30, "the dashboard lost panels"
        deadline = time.monotonic() + 20
        empty = []
        for title, expr in queries:
            promql = _substitute(expr, stack.target_regex)
            result = stack.query(promql)
            while not result and time.monotonic() < deadline:
                time.sleep(0.5)
                result = stack.query(promql)
            if not result:
                if expr not in EXCUSED_QUERIES:
                    empty.append(f"{title}: {promql}")
                continue
            bad = [v for v in _values(result) if not math.isfinite(v)]
            assert not bad, f"{title}: non-finite values {result!r} from {promql}"
        assert not empty, "panel queries without data:\n" + "\n".join(empty)

    def test_down_target_feeds_the_health_panels(self, stack):
        regex = stack.target_regex
        expected = {**{name: 1.0 for name in FAKES}, DOWN: 0.0}

        def up():
            state = {r["metric"]["target"]: float(r["value"][1])
                     for r in stack.query(f'specdec_target_up{{target=~"{regex}"}}')}
            return state if state == expected else None

        _wait_for(f"specdec_target_up == {expected}", up, 10)  # a slow scrape may blip
        errors = {r["metric"]["target"]: float(r["value"][1]) for r in stack.query(
            f'sum by (target) (rate(specdec_scrape_errors_total{{target=~"{regex}"}}[1m]))')}
        assert set(errors) == set(stack.targets) and errors[DOWN] > 0, errors
        targets_up = _substitute("sum(specdec_target_up{target=~\"$target\"})", regex)
        assert _one(stack.query(targets_up), "targets up") == len(FAKES)

    def test_dashboard_variables_and_annotations(self, stack):
        templating = {v["name"]: v for v in _dashboard()["templating"]["list"]}
        expected = {
            "job": {JOB},
            "instance": {stack.exporter_url.removeprefix("http://")},
            # The targets' own cluster arrives as `cluster` (not exported_cluster); the down
            # target has none, so it takes Prometheus's.
            "cluster": {CLUSTER, PROM_CLUSTER},
            "target": set(stack.targets),
            "model_name": {"fake/llama-3-8b", "fake/qwen-7b"},
        }
        for name, values in expected.items():
            query = templating[name]["definition"]
            match, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query).groups()
            got = stack.api_get(f"label/{label}/values",
                                **{"match[]": _substitute(match, stack.target_regex)})
            assert set(got) == values, (name, got)
        assert stack.api_get("label/exported_cluster/values") == []
        # Annotations are range queries over the dashboard's time span: the window's.
        start = stack.window_started - 5
        for annotation in _dashboard()["annotations"]["list"]:
            if not annotation.get("expr"):
                continue
            expr = _substitute(annotation["expr"], stack.target_regex)
            # The stop is seen at Prometheus's next scrape of us; on a loaded machine that can
            # come a few seconds after the stop answered, so wait for it (bounded).
            result = _wait_for(
                f"annotation {annotation['name']!r} to have data over the window",
                lambda expr=expr: stack.query_range(expr, start, time.time()), 20)
            if "windows_open" in annotation["expr"]:
                times = [float(t) for r in result for t, _ in r["values"]]
                # Open from the first scrape after the start to the first after the stop.
                assert min(times) >= stack.window_started - 1, (times, stack.window_started)
                assert max(times) <= stack.window_stopped + 5, (times, stack.window_stopped)
            if "last_window_info" in annotation["expr"]:
                marks = {(r["metric"]["id"], float(r["values"][-1][1])) for r in result}
                assert any(i == "it-window" and abs(v - stack.window_stopped * 1000) <= 1
                           for i, v in marks), marks

    def test_new_alert_expressions_are_quiet_on_a_healthy_exporter(self, stack):
        alerts = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
                  for r in g["rules"] if "alert" in r}
        for name in ("SpecDecTargetNotScraped", "SpecDecExporterDown", "SpecDecExporterAbsent",
                     "SpecDecStateWriteErrors", "SpecDecResultWriteErrors",
                     "SpecDecDiscoverySourceFailing"):
            assert stack.query(alerts[name]["expr"]) == [], name
        # What SpecDecTargetNotScraped compares: every target scraped within the interval.
        behind = stack.query("time() - specdec_target_last_scrape_timestamp_seconds"
                             " > on (job, instance) group_left () specdec_scrape_interval_seconds"
                             " * 5")
        assert behind == []
        assert {r["metric"]["target"] for r in stack.query(
            "specdec_target_last_scrape_timestamp_seconds")} == set(stack.targets)

    def test_every_recording_rule_returns_data(self, stack):
        groups = yaml.safe_load(RULES.read_text())["groups"]
        records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
        assert records
        deadline = stack.live_data_at + BASELINE_GROUP_WAIT  # live counters, then requests
        for record in records:
            result = _wait_for(f"recording rule {record}", lambda r=record: stack.query(r),
                               max(deadline - time.monotonic(), 5), interval=0.5)
            assert all(math.isfinite(v) for v in _values(result)), (record, result)
        # Every rule of the file is loaded and healthy (alerts included).
        loaded = stack.api_get("rules")["groups"]
        rules = [r for g in loaded if g["file"] == str(RULES) for r in g["rules"]]
        assert len(rules) == sum(len(g["rules"]) for g in groups)
        unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in rules
                     if r["health"] != "ok"]
        assert not unhealthy
        # The day-before baseline read the backfilled history: accepted / drafted = 0.5.
        for record in ("specdec_target:acceptance_ratio:rate1d_offset30m",
                       "specdec_target:acceptance_ratio:rate30m"):
            value = _one(stack.query(f'{record}{{target="{HISTORY_TARGET}"}}'), record)
            assert _close(value, HISTORY_RATIO), (record, value)
        # The baseline group's next evaluation with live data may be up to 1m later.
        _wait_for("live targets in specdec_target:acceptance_ratio:rate30m", lambda: set(FAKES)
                  <= {r["metric"]["target"] for r in
                      stack.query("specdec_target:acceptance_ratio:rate30m")},
                  max(stack.live_data_at + BASELINE_GROUP_WAIT - time.monotonic(), 5),
                  interval=0.5)

    def test_last_window_gauges_equal_stop_answer(self, stack):
        results = stack.window["results"]
        for name in FAKES:
            data = results[name]["data"]
            ratio = _one(stack.query(f'specdec_last_window_acceptance_ratio{{target="{name}"}}'),
                         f"last window ratio {name}")
            assert _close(ratio, data["accepted_tokens"] / data["draft_tokens"]), (name, ratio)
            assert abs(ratio * 100 - data["acceptance_rate"]) <= 0.005 + 1e-9  # 2 decimals
            length = _one(stack.query(f'specdec_last_window_acceptance_length{{target="{name}"}}'),
                          f"last window length {name}")
            assert _close(length, 1 + data["accepted_tokens"] / data["num_drafts"]), (name, length)
            assert abs(length - data["acceptance_length"]) <= 0.0005 + 1e-9  # 3 decimals
            positions = {r["metric"]["position"]: float(r["value"][1]) for r in stack.query(
                f'specdec_last_window_position_acceptance_ratio{{target="{name}"}}')}
            expected = data["per_position_acceptance_rates"]
            assert set(positions) == set(expected), (name, positions)
            for position, value in positions.items():
                # The answer rounds to 4 decimals; the gauge is exact.
                assert abs(value - expected[position]) <= 0.5e-4 + 1e-12, (name, position)
        for metric in ("specdec_last_window_acceptance_ratio",
                       "specdec_last_window_acceptance_length"):
            assert stack.query(f'{metric}{{target="{DOWN}"}}') == [], f"{metric} for a na target"
        info = _one(stack.query('specdec_last_window_info{id="it-window"}'), "window info")
        assert abs(info - stack.window_stopped) <= 1e-3, (info, stack.window_stopped)

    def test_last_window_reports_every_draft_position(self, stack):
        # k12's server exposes all 12 position counters; positions 9 to 11 stay at 0 in the
        # window and must read 0, not vanish (fixed in e49b035), in numeric order.
        rates = stack.window["results"]["k12"]["data"]["per_position_acceptance_rates"]
        gauges = {r["metric"]["position"]: float(r["value"][1]) for r in stack.query(
            'specdec_last_window_position_acceptance_ratio{target="k12"}')}
        assert list(rates) == [str(i) for i in range(12)], rates
        assert rates["11"] == 0.0 and gauges.get("11") == 0.0, gauges
        assert len(gauges) == 12

    def test_per_position_panels_come_in_numeric_order(self, stack):
        """What Grafana gets for each per-position panel: series in order 0, 1, ..., 10, 11."""
        checked = []
        end = time.time()
        for title, expr in _panel_queries():
            if "per_position" not in expr or title.startswith(("Last window", "Live")):
                continue  # the tables convert the column to a number and sort by it
            promql = _substitute(expr, stack.target_regex)
            result = _wait_for(f"{title} over a minute", lambda q=promql: stack.query_range(
                q, end - 60, end, "5s"), 20)
            order = [r["metric"]["position"] for r in result]
            assert [int(p) for p in order] == list(range(12)), (title, order)
            checked.append(title)
        assert len(checked) == 3, checked  # time series, bar gauge, heatmap

    def test_per_engine_panel_shows_each_rank_of_the_two_engine_server(self, stack):
        (expr,) = [e for t, e in _panel_queries()
                   if t.startswith("Draft acceptance rate per engine")]
        result = _wait_for("per-engine acceptance", lambda: stack.query(
            _substitute(expr, stack.target_regex)), 20)
        assert {(r["metric"]["target"], r["metric"]["engine"]) for r in result} == {
            ("k3dp2", "0"), ("k3dp2", "1")}
        assert all(0 < float(r["value"][1]) <= 1 for r in result)

    def test_fleet_position_divides_by_the_drafts_of_targets_drafting_it(self, stack):
        """Mixed k: position 3 is drafted by k5 and k12, not by k3dp2 (k=3: positions 0-2)."""
        (title, expr), = [(t, e) for t, e in _panel_queries()
                          if t.startswith("Acceptance rate by draft position")]
        at = f"{time.time() - 2:.3f}"
        fleet = {r["metric"]["position"]: float(r["value"][1]) for r in stack.query(
            _substitute(expr, stack.target_regex), at)}
        own = _one(stack.query(
            'sum(rate(specdec_accepted_tokens_per_position_total{target=~"k5|k12",position="3"}'
            '[1m])) / sum(rate(specdec_drafts_total{target=~"k5|k12"}[1m]))', at),
            "position 3 over the drafts of k5 and k12")
        assert own > 0 and _close(fleet["03"], own), (fleet, own)
        diluted = _one(stack.query(
            'sum(rate(specdec_accepted_tokens_per_position_total{position="3"}[1m]))'
            ' / sum(rate(specdec_drafts_total[1m]))', at), "position 3 over all drafts")
        assert diluted < fleet["03"] * 0.95, (fleet["03"], diluted)

    def test_fleet_recording_rule_equals_direct_query(self, stack):
        """At one rule evaluation time, the recorded fleet ratio equals the ratio of sums.

        A rule evaluated while a scrape was being committed can miss a sample that a later
        query at the same time sees. So the exporter is stopped first: every evaluation after
        Prometheus recorded the failed scrape read complete, final data.
        """
        stack.exporter.stop()

        def failed_scrape():
            # Raw samples of `up`: the time of the first failed scrape of the exporter.
            samples = stack.query(f'up{{job="{JOB}"}}[30s]')
            return next((float(t) for r in samples for t, v in r["values"] if v == "0"), None)

        failed_at = _wait_for("Prometheus to record the exporter down", failed_scrape, 15)
        # SpecDecExporterDown's expression (before its `for`) finds exactly this exporter.
        alerts = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
                  for r in g["rules"] if "alert" in r}
        down = _wait_for("SpecDecExporterDown's expression to match", lambda: stack.query(
            alerts["SpecDecExporterDown"]["expr"]), 15)
        assert [(r["metric"]["job"], r["metric"]["instance"]) for r in down] == [
            (JOB, stack.exporter_url.removeprefix("http://"))]

        def evaluation_after_failure():
            samples = stack.query("specdec:acceptance_ratio:rate5m[30s]")
            times = [float(t) for r in samples for t, _ in r["values"] if float(t) > failed_at]
            return max(times) if times else None

        evaluated = _wait_for("a fleet rule evaluation after the failure",
                              evaluation_after_failure, 15)
        at = f"{evaluated:.3f}"
        pairs = {
            "specdec:acceptance_ratio:rate5m":
                "sum(rate(specdec_accepted_tokens_total[5m]))"
                " / sum(rate(specdec_draft_tokens_total[5m]))",
            "specdec:acceptance_length:rate5m":
                "1 + sum(rate(specdec_accepted_tokens_total[5m]))"
                " / sum(rate(specdec_drafts_total[5m]))",
        }
        for name in FAKES:
            pairs[f'specdec_target:acceptance_ratio:rate5m{{target="{name}"}}'] = (
                f'sum(rate(specdec_accepted_tokens_total{{target="{name}"}}[5m]))'
                f' / sum(rate(specdec_draft_tokens_total{{target="{name}"}}[5m]))')
        for record, direct in pairs.items():
            recorded = _one(stack.query(record, at), record)
            computed = _one(stack.query(direct, at), direct)
            assert _close(recorded, computed), (record, at, recorded, computed)
        # A fleet ratio is not the mean of the targets' ratios (k5 ~0.8 vs k3dp2 ~0.6 here).
        per_target = _values(stack.query("specdec_target:acceptance_ratio:rate5m", at))
        fleet = _one(stack.query("specdec:acceptance_ratio:rate5m", at), "fleet")
        assert not _close(fleet, sum(per_target) / len(per_target), 1e-6)
