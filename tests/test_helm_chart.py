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
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "specdec-exporter"
TEMPLATES = CHART / "templates"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
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
        kinds = sorted(k for k, _ in _objects(render({**ALL_ON, "token": {"value": "t"},
                                                       "serviceAccount": {"create": True}})))
        assert kinds == [
            "ConfigMap",
            "ConfigMap",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
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

    def test_shard_index_comes_from_the_pod_name_without_a_shell(self, render, monkeypatch):
        """No shell wrapper: the CLI reads the ordinal off SPECDEC_POD_NAME itself."""
        from exporter.cli.serving import env_overrides

        c = _container(render(ALL_ON))
        assert "command" not in c
        assert c["args"] == ["serve", "--config", "/etc/specdec/exporter.yaml"]
        monkeypatch.delenv("SPECDEC_SHARD_INDEX", raising=False)
        for e in _env(render(ALL_ON)).values():
            if "value" in e:
                monkeypatch.setenv(e["name"], e["value"])
        monkeypatch.setenv("SPECDEC_POD_NAME", "rel-specdec-exporter-12")
        overrides = env_overrides()
        assert overrides["shard_index"] == "12" and overrides["shards"] == "3"

    def test_peers_list_every_shard_through_the_headless_service(self, render):
        env = _env(render(ALL_ON))
        peers = env["SPECDEC_PEERS"]["value"].split(",")
        assert peers == [
            f"http://rel-specdec-exporter-{i}.rel-specdec-exporter-headless.monitoring.svc:9400"
            for i in range(3)
        ]
        assert "SPECDEC_PEERS" not in _env(render())  # one shard: nobody to fan out to

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

    def test_service_monitor_options(self, render):
        (sm,) = render(ALL_ON)["servicemonitor.yaml"]
        (endpoint,) = sm["spec"]["endpoints"]
        # A target's own `cluster` label arrives as `cluster`, not `exported_cluster`.
        assert endpoint["honorLabels"] is True and endpoint["scheme"] == "http"
        assert "jobLabel" not in sm["spec"] and "namespaceSelector" not in sm["spec"]
        relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "node"}]
        metric_relabel = [{"action": "drop", "regex": "specdec_build_info",
                           "sourceLabels": ["__name__"]}]
        values = {**ALL_ON, "serviceMonitor": {
            "enabled": True, "jobLabel": "app.kubernetes.io/name",
            "namespaceSelector": {"any": True}, "scheme": "https",
            "tlsConfig": {"insecureSkipVerify": True}, "honorLabels": False,
            "relabelings": relabel, "metricRelabelings": metric_relabel}}
        (sm,) = render(values)["servicemonitor.yaml"]
        (endpoint,) = sm["spec"]["endpoints"]
        assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name"
        assert sm["spec"]["namespaceSelector"] == {"any": True}
        assert endpoint["scheme"] == "https" and endpoint["honorLabels"] is False
        assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
        assert endpoint["relabelings"] == relabel
        assert endpoint["metricRelabelings"] == metric_relabel

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

    def test_prometheus_rule_overrides_labels_and_disable_list(self, render):
        shipped = yaml.safe_load((ROOT / "deploy/prometheus/rules.yml").read_text())
        alerts = {r["alert"]: r for g in shipped["groups"] for r in g["rules"] if "alert" in r}
        values = {**ALL_ON, "prometheusRule": {
            "enabled": True, "additionalAlertLabels": {"team": "ml-platform"},
            "alerts": {"SpecDecTargetDown": {"for": "12m", "severity": "critical"},
                       "SpecDecScrapeErrors": {"severity": "warning"}},
            "disabled": ["SpecDecAcceptanceDrop"]}}
        (rule,) = render(values)["prometheusrule.yaml"]
        got = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
        assert set(got) == set(alerts) - {"SpecDecAcceptanceDrop"}
        down = got["SpecDecTargetDown"]
        assert down["for"] == "12m" and down["labels"]["severity"] == "critical"
        assert got["SpecDecScrapeErrors"]["for"] == alerts["SpecDecScrapeErrors"]["for"]
        assert got["SpecDecScrapeErrors"]["labels"]["severity"] == "warning"
        for name, r in got.items():
            assert r["labels"]["team"] == "ml-platform", name
            assert r["expr"] == alerts[name]["expr"] and r["annotations"] == alerts[name][
                "annotations"]
            if name not in values["prometheusRule"]["alerts"]:
                assert r["labels"]["severity"] == alerts[name]["labels"]["severity"], name
        records = [r for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r]
        assert records == [r for g in shipped["groups"] for r in g["rules"] if "record" in r]

    def test_dashboard_configmap(self, render):
        (cm,) = render(ALL_ON)["dashboard-configmap.yaml"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads((ROOT / "deploy/grafana/specdec-exporter.json").read_text())
        assert json.loads(cm["data"]["specdec-exporter.json"]) == shipped

    def test_extra_env_volumes_args_and_pod_metadata(self, render):
        extra_env = [{"name": "LLAMA_TOKEN",
                      "valueFrom": {"secretKeyRef": {"name": "tok", "key": "llama"}}},
                     {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]
        env_from = [{"secretRef": {"name": "proxy-settings"}}]
        volumes = [{"name": "sd", "configMap": {"name": "vllm-targets"}},
                   {"name": "ca", "secret": {"secretName": "vllm-ca"}}]
        mounts = [{"name": "sd", "mountPath": "/etc/specdec/sd", "readOnly": True},
                  {"name": "ca", "mountPath": "/etc/specdec/ca", "readOnly": True}]
        docs = render({**ALL_ON, "extraEnv": extra_env, "envFrom": env_from,
                       "extraVolumes": volumes, "extraVolumeMounts": mounts,
                       "extraArgs": ["--log-format", "json"],
                       "podLabels": {"team": "ml"}, "podAnnotations": {"a/b": "c"},
                       "commonLabels": {"env": "prod"}, "priorityClassName": "high"})
        c = _container(docs)
        pod = _statefulset(docs)["spec"]["template"]
        assert c["env"][-2:] == extra_env and c["envFrom"] == env_from
        assert c["volumeMounts"][-2:] == mounts
        assert pod["spec"]["volumes"][-2:] == volumes
        assert c["args"][-2:] == ["--log-format", "json"]
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert pod["metadata"]["labels"]["env"] == "prod"
        assert pod["metadata"]["annotations"]["a/b"] == "c"
        assert pod["spec"]["priorityClassName"] == "high"
        for obj in _objects(docs).values():
            assert obj["metadata"]["labels"]["env"] == "prod", obj["kind"]

    def test_image_registry_tag_and_digest(self, render):
        assert _container(render())["image"] == (
            "ghcr.io/specdec-exporter/specdec-exporter:" + CHART_YAML["appVersion"])
        digest = "sha256:" + "ab" * 32
        c = _container(render({"image": {"registry": "registry.local:5000",
                                         "repository": "ml/specdec", "digest": digest}}))
        assert c["image"] == f"registry.local:5000/ml/specdec@{digest}"
        c = _container(render({"image": {"registry": "", "repository": "specdec",
                                         "tag": "dev"}}))
        assert c["image"] == "specdec:dev"

    def test_image_default_is_what_ci_publishes(self):
        workflow = yaml.safe_load((ROOT / ".github/workflows/image.yml").read_text())
        text = json.dumps(workflow)
        assert VALUES["image"]["registry"] == "ghcr.io"
        owner, name = VALUES["image"]["repository"].split("/")
        assert "ghcr.io/${{ github.repository_owner }}/" + name in text
        assert owner  # the owner is the GitHub organisation publishing the image

    def test_service_account_and_pdb(self, render):
        docs = render(ALL_ON)
        (pdb,) = docs["poddisruptionbudget.yaml"]
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"] == (
            _statefulset(docs)["spec"]["selector"]["matchLabels"])
        assert render()["poddisruptionbudget.yaml"] == []  # one shard: nothing to keep up
        assert docs["serviceaccount.yaml"] == []
        assert _statefulset(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "default"
        docs = render({"serviceAccount": {"create": True,
                                          "annotations": {"iam/role": "x"}}})
        (sa,) = docs["serviceaccount.yaml"]
        assert sa["metadata"]["annotations"] == {"iam/role": "x"}
        pod = _statefulset(docs)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa["metadata"]["name"] == "rel-specdec-exporter"
        assert pod["automountServiceAccountToken"] is False

    def test_topology_spread_gets_the_pod_selector(self, render):
        spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                   "whenUnsatisfiable": "ScheduleAnyway"}]
        docs = render({"topologySpreadConstraints": spread})
        (got,) = _statefulset(docs)["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert got == spread[0] | {"labelSelector": {
            "matchLabels": _statefulset(docs)["spec"]["selector"]["matchLabels"]}}

    def test_notes_list_every_shard_url(self, helm):
        chart = helm.Chart.load(str(CHART))
        try:
            out = chart.render({"shards": 3}, name="rel", namespace="ml", is_install=True)
        finally:
            chart.close()
        notes = next(text for path, text in out.items() if path.endswith("NOTES.txt"))
        for i in range(3):
            assert (f"shard {i}: http://rel-specdec-exporter-{i}.rel-specdec-exporter-headless"
                    f".ml.svc:9400/") in notes
        assert "shard 3" not in notes

    @pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-options"])
    @pytest.mark.parametrize("kube", [None, "1.30.0", "1.37.0"])
    def test_lint(self, helm, values, kube):
        result = helm.lint(str(CHART), values, strict=True, kube_version=kube)
        assert result["errors"] == [], result
        serious = [m for m in result["messages"] if m["severity"] > 1]
        assert serious == [], serious


class TestSchema:
    """values.schema.json: Helm refuses unknown keys and wrong types at lint and install."""

    @pytest.mark.parametrize("values, where", [
        ({"serviceMonitor": {"enable": True}}, "'/serviceMonitor': additional properties "
                                               "'enable' not allowed"),
        ({"shard": 2}, "additional properties 'shard' not allowed"),
        ({"shards": 0}, "/shards"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"prometheusRule": {"alerts": {"SpecDecTargetDown": {"severity": "page"}}}},
         "/prometheusRule/alerts/SpecDecTargetDown/severity"),
        ({"extraArgs": "--log-format json"}, "/extraArgs"),
    ])
    def test_a_typo_fails_lint_and_install(self, helm, render, values, where):
        result = helm.lint(str(CHART), values, strict=True)
        assert any(where in e for e in result["errors"]), result["errors"]
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            render(values)

    def test_every_value_has_a_schema_entry(self):
        schema = json.loads((CHART / "values.schema.json").read_text())

        def walk(tree, node, path):
            for key, value in tree.items():
                assert key in node.get("properties", {}), ".".join(path + [key])
                child = node["properties"][key]
                if isinstance(value, dict) and child.get("additionalProperties") is False:
                    walk(value, child, path + [key])

        walk(VALUES, schema, [])
        assert schema["additionalProperties"] is False
