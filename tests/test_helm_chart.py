"""Checks of the Helm chart without a helm binary or a cluster.

Rendering uses helm-python-sdk (import name helm_python), which binds Helm's own Go SDK
(template engine, sprig functions, .Files, lint) through a bundled shared library, so the
templates are rendered exactly as `helm template` would. The values/template cross-check is
plain text analysis and needs nothing.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "specdec-exporter"
TEMPLATES = CHART / "templates"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
ALL_ON = {
    "shards": 3,
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "dashboard": {"enabled": True},
}


def _template_text() -> str:
    return "\n".join(p.read_text() for p in sorted(TEMPLATES.iterdir()) if p.is_file())


def used_values_paths(text: str) -> set[tuple[str, ...]]:
    """Every `.Values.a.b` path the templates read, plus the keys of `dig "k"... .Values.x`."""
    paths = {
        tuple(m.group(1).split(".")[1:])
        for m in re.finditer(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text)
    }
    for m in re.finditer(r'dig((?:\s+"[^"]*")+)\s+\$?\.Values((?:\.\w+)+)', text):
        keys = re.findall(r'"([^"]*)"', m.group(1))[:-1]  # the last string is the default
        paths.add(tuple(m.group(2).split(".")[1:]) + tuple(keys))
    return paths


def values_leaves(tree: dict, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths of values.yaml down to scalars, lists and empty maps."""
    out = set()
    for key, value in tree.items():
        path = prefix + (key,)
        out |= values_leaves(value, path) if isinstance(value, dict) and value else {path}
    return out


def _lookup(tree, path):
    for key in path:
        assert isinstance(tree, dict) and key in tree, ".".join(path)
        tree = tree[key]
    return tree


class TestValuesCrossCheck:
    def test_every_used_path_exists_in_values(self):
        used = used_values_paths(_template_text())
        assert ("shards",) in used and ("config",) in used
        for path in used:
            _lookup(VALUES, path)

    def test_every_value_is_used(self):
        used = used_values_paths(_template_text())
        for leaf in values_leaves(VALUES):
            assert any(leaf[: len(p)] == p for p in used), f"values.{'.'.join(leaf)} is never read"


@pytest.fixture(scope="module")
def helm():
    try:
        import helm_python
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("helm-python-sdk is not installed: pip install helm-python-sdk")
        pytest.skip(
            "helm-python-sdk not installed (pip install helm-python-sdk): chart not rendered"
        )
    return helm_python


@pytest.fixture(scope="module")
def render(helm):
    chart = helm.Chart.load(str(CHART))

    def _render(values: dict | None = None) -> dict[str, list[dict]]:
        """Template file name -> its YAML documents; fails on any YAML error."""
        out = chart.render(values, name="rel", namespace="monitoring", is_install=True)
        docs = {}
        for path, text in out.items():
            if path.endswith("NOTES.txt"):
                continue
            docs[Path(path).name] = [d for d in yaml.safe_load_all(text) if d is not None]
        return docs

    yield _render
    chart.close()


def _objects(docs: dict[str, list[dict]]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for ds in docs.values() for d in ds}


def _statefulset(docs) -> dict:
    (sts,) = docs["statefulset.yaml"]
    return sts


def _container(docs) -> dict:
    (c,) = _statefulset(docs)["spec"]["template"]["spec"]["containers"]
    return c


def _env(docs) -> dict[str, dict]:
    return {e["name"]: e for e in _container(docs)["env"]}


class TestRender:
    def test_default_kinds(self, render):
        objects = _objects(render())
        assert sorted(objects) == [
            ("ConfigMap", "rel-specdec-exporter"),
            ("Service", "rel-specdec-exporter"),
            ("Service", "rel-specdec-exporter-headless"),
            ("StatefulSet", "rel-specdec-exporter"),
        ]
        for obj in objects.values():
            assert obj["apiVersion"]
            assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"

    def test_all_options_kinds(self, render):
        kinds = sorted(k for k, _ in _objects(render({**ALL_ON, "token": {"value": "t"}})))
        assert kinds == [
            "ConfigMap",
            "ConfigMap",
            "PrometheusRule",
            "Secret",
            "Service",
            "Service",
            "ServiceMonitor",
            "StatefulSet",
        ]

    def test_configmap_is_values_config(self, render):
        (cm,) = render()["configmap.yaml"]
        assert yaml.safe_load(cm["data"]["exporter.yaml"]) == VALUES["config"]

    def test_checksum_annotation_follows_config(self, render):
        def checksum(values):
            sts = _statefulset(render(values))
            return sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

        default = checksum(None)
        assert re.fullmatch(r"[0-9a-f]{64}", default)
        changed = checksum({"config": {**VALUES["config"], "scrape_interval": "10s"}})
        assert changed != default

    def test_security_context(self, render):
        docs = render()
        pod = _statefulset(docs)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        sc = _container(docs)["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert pod["automountServiceAccountToken"] is False

    def test_probes_ports_resources(self, render):
        c = _container(render())
        assert c["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "http"}
        assert c["ports"] == [{"name": "http", "containerPort": 9400, "protocol": "TCP"}]
        assert c["resources"] == VALUES["resources"]
        assert _env(render())["SPECDEC_LISTEN"]["value"] == "0.0.0.0:9400"

    def test_data_volume(self, render):
        docs = render()
        sts = _statefulset(docs)
        mounts = {m["mountPath"]: m["name"] for m in _container(docs)["volumeMounts"]}
        assert mounts["/data"] == "data" and mounts["/etc/specdec"] == "config"
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data"
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"

        sts = _statefulset(render({"persistence": {"enabled": False}}))
        assert "volumeClaimTemplates" not in sts["spec"]
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert volumes["data"] == {"name": "data", "emptyDir": {}}

    def test_shards(self, render):
        docs = render(ALL_ON)
        sts = _statefulset(docs)
        assert sts["spec"]["replicas"] == 3
        assert sts["spec"]["serviceName"] == "rel-specdec-exporter-headless"
        env = _env(docs)
        assert env["SPECDEC_SHARDS"]["value"] == "3"
        assert env["SPECDEC_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    def test_shard_index_is_the_pod_ordinal(self, render, tmp_path):
        """Run the container's shell command with a stand-in specdec-exporter."""
        stub = tmp_path / "specdec-exporter"
        stub.write_text('#!/bin/sh\necho "$SPECDEC_SHARD_INDEX $SPECDEC_SHARDS $*"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
        c = _container(render(ALL_ON))
        env = {
            "PATH": f"{tmp_path}:/usr/bin:/bin",
            "SPECDEC_POD_NAME": "rel-specdec-exporter-12",
            "SPECDEC_SHARDS": "3",
            "SPECDEC_CONFIG": "/etc/specdec/exporter.yaml",
        }
        out = subprocess.run(c["command"], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "12 3 serve --config /etc/specdec/exporter.yaml"

    def test_token_secret(self, render):
        docs = render({"token": {"value": "s3cret"}})
        (secret,) = docs["secret.yaml"]
        assert base64.b64decode(secret["data"]["token"]).decode() == "s3cret"
        ref = _env(docs)["SPECDEC_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": "token", "optional": True}

        docs = render({"token": {"existingSecret": "mine", "key": "bearer"}})
        assert docs["secret.yaml"] == []
        ref = _env(docs)["SPECDEC_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "mine" and ref["key"] == "bearer"

    def test_token_env_name_follows_config(self, render):
        config = {**VALUES["config"], "auth": {"token_env": "MY_TOKEN"}}
        assert "MY_TOKEN" in _env(render({"config": config}))

    def test_service_monitor_selects_only_the_metrics_service(self, render):
        docs = render(ALL_ON)
        (sm,) = docs["servicemonitor.yaml"]
        selector = sm["spec"]["selector"]["matchLabels"]
        selected = [
            s["metadata"]["name"]
            for s in docs["service.yaml"]
            if selector.items() <= s["metadata"]["labels"].items()
        ]
        assert selected == ["rel-specdec-exporter"]
        assert sm["spec"]["endpoints"][0]["port"] == "http"

    def test_prometheus_rule_is_rules_yml(self, render):
        (rule,) = render(ALL_ON)["prometheusrule.yaml"]
        shipped = yaml.safe_load((ROOT / "deploy/prometheus/rules.yml").read_text())
        assert rule["spec"] == shipped

    def test_dashboard_configmap(self, render):
        (cm,) = render(ALL_ON)["dashboard-configmap.yaml"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads((ROOT / "deploy/grafana/specdec-exporter.json").read_text())
        assert json.loads(cm["data"]["specdec-exporter.json"]) == shipped

    @pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-options"])
    def test_lint(self, helm, values):
        result = helm.lint(str(CHART), values, strict=True)
        assert result["errors"] == [], result
        serious = [m for m in result["messages"] if m["severity"] > 1]
        assert serious == [], serious
