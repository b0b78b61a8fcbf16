"""The Kubernetes manifests in deploy/ validate, offline, against the schemas of a stated
Kubernetes version (kubernetes-validate ships them), strictly (no unknown field); the
kustomization lists every manifest; every deepx-flow command in them parses with the CLI's
own parser; every selector and named port refers to something that exists."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

KUBERNETES = "1.33.0"  # the version docs/deploy.md states
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def _documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _pods(doc):
    """The pod template of a workload (Deployment, StatefulSet), else None."""
    return doc.get("spec", {}).get("template") if doc["kind"] in ("Deployment",
                                                                   "StatefulSet") else None


def test_the_kustomization_lists_every_manifest_and_nothing_else():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    keys = {line.split("=")[0] for line in (DEPLOY / "secrets.env.example").read_text()
            .splitlines() if line and not line.startswith("#")}
    used = set()
    for path in MANIFESTS:
        for doc in _documents(path):
            pods = _pods(doc)
            for c in (pods["spec"]["containers"] if pods else []):
                for env in c.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] == "deepx-secrets"
                        used.add(ref["key"])
    assert used == keys  # every secret a pod reads is in the example, and no other


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_validates_strictly(path):
    for doc in _documents(path):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_manifest_with_a_mistake_is_refused():
    doc = _documents(DEPLOY / "gateway.yaml")[1]
    doc["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_every_deepx_flow_command_parses_and_names_resolve(capsys):
    from deepx_flow.cli.main import _parser
    parser = _parser()
    labels, services, commands = [], [], 0
    for path in MANIFESTS:
        for doc in _documents(path):
            if doc["kind"] == "Service":
                services.append(doc)
            pods = _pods(doc)
            if pods is None:
                continue
            assert doc["spec"]["selector"]["matchLabels"].items() <= \
                pods["metadata"]["labels"].items(), path.name
            labels.append(pods["metadata"]["labels"])
            for c in pods["spec"]["containers"]:
                ports = {p["name"] for p in c.get("ports", [])}
                for probe in ("readinessProbe", "livenessProbe"):
                    for kind in ("httpGet", "tcpSocket"):
                        port = c.get(probe, {}).get(kind, {}).get("port")
                        assert port is None or port in ports, (path.name, probe, port)
                if c.get("command", [""])[0] == "deepx-flow":
                    parser.parse_args(c["command"][1:])  # exits 2 on a wrong flag
                    commands += 1
    assert commands == 2  # the gateway and the dashboard
    for service in services:  # each selects a workload, by a named port it has
        selected = [l for l in labels if service["spec"]["selector"].items() <= l.items()]
        assert selected, service["metadata"]["name"]
