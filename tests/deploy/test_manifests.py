"""The deployment files, offline: Kubernetes manifests against the 1.33 API schemas
(strict: no unknown field), the kustomize build, the manifests' consistency with the image
and the server's settings, the Prometheus configuration (promtool), the compose file's
shape, the Dockerfiles (hadolint) and the native build flags."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dockertools import DEPLOY, DOC_COMMANDS, ROOT, require, tool_command

K8S = DEPLOY / "k8s"
K8S_VERSION = "1.33"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}:{os.environ.get('PATH', '')}")
    require(found is not None, f"{name} is not installed (`pip install '.[deploy]'`, or `make promtool`)")
    return found


def kubernetes_validate():
    try:
        import kubernetes_validate as kv
    except ImportError:
        require(False, "kubernetes-validate is not installed (`pip install '.[deploy]'`)")
    return kv


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def built() -> list[dict]:
    """`kubectl kustomize` of deploy/k8s, exactly as the docs apply it."""
    out = subprocess.run(
        tool_command("kustomize", tool("kubectl")), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''}"
    return found[0] if name else found


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_strictly(path):
    kv = kubernetes_validate()
    docs = documents(path)
    assert docs
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError


def test_manifests_validate_with_the_documented_command():
    """kubernetes-validate's own command line, as the docs give it: every manifest file."""
    command = tool_command("validate", tool("kubernetes-validate"))
    assert sorted(ROOT / p for p in command if p.startswith("deploy/k8s/")) == manifest_files()
    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    resources = sum(len(documents(p)) for p in manifest_files())
    assert r.stdout.count(" passed for resource ") == resources, r.stdout


def test_documented_validation_rejects_an_unknown_field(tmp_path):
    """The same command fails on a misspelt field (strict), naming it."""
    bad = tmp_path / "server.yaml"
    bad.write_text((K8S / "server.yaml").read_text().replace("readOnlyRootFilesystem:", "readOnlyRootFilesysten:"))
    command = [a for a in tool_command("validate", tool("kubernetes-validate")) if not a.startswith("deploy/k8s/")]
    r = subprocess.run([*command, str(bad)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "readOnlyRootFilesysten" in r.stdout + r.stderr, r.stdout + r.stderr


def test_strict_validation_catches_unknown_fields():
    kv = kubernetes_validate()
    doc = documents(K8S / "server.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["sevice"] = "typo"
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, K8S_VERSION, strict=True)


def test_kustomize_build_validates_and_embeds_envoy_yaml():
    kv = kubernetes_validate()
    docs = built()
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    print("\n" + "\n".join(kinds))
    envoy_cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tensorops-envoy-")]
    assert len(envoy_cm) == 1  # hashed name: a new envoy.yaml rolls the balancer
    assert envoy_cm[0]["data"]["envoy.yaml"] == (DEPLOY / "envoy.yaml").read_text()
    balancer = by_kind(docs, "Deployment", "tensorops-balancer")
    volumes = {v["name"]: v for v in balancer["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == envoy_cm[0]["metadata"]["name"]
    expected = {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    assert {d["kind"] for d in docs} == expected


def server_settings() -> dict[str, str]:
    return by_kind(documents(K8S / "server-config.yaml"), "ConfigMap", "tensorops-config")["data"]


def dockerfile_user() -> str:
    return re.findall(r"^USER\s+(\S+)", (DEPLOY / "Dockerfile").read_text(), re.M)[-1]


def test_server_deployment():
    docs = [d for p in manifest_files() for d in documents(p)]
    dep = by_kind(docs, "Deployment", "tensorops")
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = pod["spec"]
    (c,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9100}
    # native gRPC probes on the gRPC port; readiness asks about the operations service
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"]["port"] == 50051, probe
    assert c["readinessProbe"]["grpc"]["service"] == "tensorops.v1.TensorOps"
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys() <= c["resources"]["limits"].keys() | {"cpu"}
    assert {"cpu", "memory"} <= c["resources"]["limits"].keys()
    # the stop sequence fits in the grace period
    settings = server_settings()
    pre_stop = c["lifecycle"]["preStop"]
    sleep = int(pre_stop["exec"]["command"][-1]) if "exec" in pre_stop else pre_stop["sleep"]["seconds"]
    drain = float(settings.get("TENSOROPS_DRAIN_DELAY", 0)) + float(settings["TENSOROPS_GRACE"])
    assert spec["terminationGracePeriodSeconds"] > sleep + drain + 5
    # non-root as the image's own user, read-only root, nothing to escalate
    uid = int(dockerfile_user().split(":")[0])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == uid == 10001
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    spread = spec["topologySpreadConstraints"]
    assert any(t["topologyKey"] == "kubernetes.io/hostname" for t in spread)
    for t in spread:
        assert t["labelSelector"]["matchLabels"].items() <= labels.items()
    assert c["envFrom"][0]["configMapRef"]["name"] == "tensorops-config"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["metrics"])


def test_services_autoscaler_and_budgets():
    docs = [d for p in manifest_files() for d in documents(p)]
    server_labels = by_kind(docs, "Deployment", "tensorops")["spec"]["template"]["metadata"]["labels"]
    balancer = by_kind(docs, "Deployment", "tensorops-balancer")
    balancer_labels = balancer["spec"]["template"]["metadata"]["labels"]
    front = by_kind(docs, "Service", "tensorops")
    assert front["spec"]["selector"].items() <= balancer_labels.items()
    headless = by_kind(docs, "Service", "tensorops-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= server_labels.items()
    # the balancer finds the replicas through the headless Service's name
    env = {e["name"]: e.get("value") for e in balancer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TENSOROPS_UPSTREAMS"] == "tensorops-headless:50051"
    hpa = by_kind(docs, "HorizontalPodAutoscaler", "tensorops")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tensorops"}
    assert hpa["spec"]["minReplicas"] == 3
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    pdb = by_kind(docs, "PodDisruptionBudget", "tensorops")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= server_labels.items()
    for dep in (by_kind(docs, "Deployment", "tensorops"), balancer):
        sc = dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]


def test_server_settings_are_known_flags():
    """Every TENSOROPS_* the ConfigMap sets is a setting of this server (a typo would be
    silently ignored), except settings of the balancer work not merged here yet."""
    from tensorops_server import config

    known = {config.env_name(f.name) for f in config.fields(config.Config)}
    pending = {"TENSOROPS_DRAIN_DELAY", "TENSOROPS_MAX_CONNECTION_AGE", "TENSOROPS_INSTANCE_NAME"} - known
    unknown = set(server_settings()) - known - pending
    assert not unknown, unknown


def test_prometheus_config():
    r = subprocess.run(tool_command("promtool", tool("promtool")), cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"tensorops-{i}:9100" for i in (1, 2, 3)}


def test_compose_file_shape():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    replicas = [name for name in services if name.startswith("tensorops-")]
    assert replicas == ["tensorops-1", "tensorops-2", "tensorops-3"]
    for name in replicas:
        s = services[name]
        assert s["image"] == "${TENSOROPS_IMAGE:-tensorops:latest}"
        assert s["read_only"] is True and s["tmpfs"] == ["/tmp:size=64m"]
        assert "ports" not in s  # only the balancer is published
        assert s["environment"]["TENSOROPS_INSTANCE_NAME"] == name
    balancer = services["balancer"]
    assert balancer["ports"] == ["127.0.0.1:${TENSOROPS_LB_PORT:-50051}:50051"]
    assert balancer["environment"]["TENSOROPS_UPSTREAMS"] == ",".join(f"{r}:50051" for r in replicas)
    assert "./envoy.yaml:/etc/envoy/envoy.yaml:ro" in balancer["volumes"]


def test_dockerfiles_lint_clean():
    command = tool_command("hadolint", tool("hadolint"))
    assert sorted(command[1:]) == ["deploy/Dockerfile", "deploy/envoy.Dockerfile"]
    for dockerfile in command[1:]:
        text = (ROOT / dockerfile).read_text()
        assert "# syntax=" not in text, dockerfile  # BuildKit would fetch a frontend image
        assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", text, re.M), dockerfile
    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def readme_deploy_commands() -> list[str]:
    """The shell commands of README's "Deploy" section: continuation lines joined, comments
    dropped."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Deploy\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README has no Deploy section"
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", section.group(1), re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line:
                commands.append(" ".join(line.split()))
    return commands


# What the README may add to a command the tests run: the steps a test machine cannot take.
NOT_RUN_HERE = {"kubectl apply -f -"}  # there is no cluster: the tests validate the manifests instead


def test_readme_deploy_commands_are_the_tested_ones():
    """Every command of README's Deploy section is one that the tests run, word for word
    (DOC_COMMANDS), and each of those is in the README."""
    shown = readme_deploy_commands()
    tested = {" ".join(shlex.split(c)) for c in DOC_COMMANDS.values()} | {"make test-deploy"}
    for command in shown:
        first, *rest = [part.strip() for part in command.split(" | ")]
        assert " ".join(shlex.split(first)) in tested, f"README shows an untested command: {command}"
        assert set(rest) <= NOT_RUN_HERE, command
    firsts = {" ".join(shlex.split(c.split(" | ")[0])) for c in shown}
    missing = tested - firsts
    assert not missing, f"tested but not in the README: {missing}"


def test_native_build_flags_are_portable():
    """The image must run on any x86-64 CPU: no host-specific compiler flag in the cffi
    build (the AVX2/AVX-512 variants use per-file target pragmas and run-time dispatch)."""
    text = (ROOT / "native" / "build_ffi.py").read_text()
    for flag in ("-march", "-mtune", "-mavx", "-msse4", "-mfma", "-mcpu"):
        assert flag not in text, flag
