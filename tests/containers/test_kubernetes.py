"""deploy/kubernetes played with `podman kube play` against this machine's PostgreSQL and
Redis: the web and consumer Deployments as written (their security context, probes' paths,
environment and volumes), the ConfigMap's settings; what podman 4.3 cannot play is tested
another way: the migration Job's container run as a plain container, the Secrets' values
given as environment, the audit key's secret volume as a host folder, host networking for
the Services. A run goes from the API through a gate to its end on the consumer pod."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from ..support.containers import ROOT, podman
from ..support.processes import free_port, wait_for
from .conftest import through_the_gate

MANIFESTS = ROOT / "deploy" / "kubernetes"


def documents() -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and doc["kind"] != "Kustomization":
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def playable(doc: dict, image: str, env: dict[str, str], key_dir: Path, name: str) -> dict:
    """A Deployment as podman 4.3 plays it: settings from the ConfigMap and Secret given as
    environment, the audit key's secret volume a host folder, the host's network."""
    spec = doc["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    doc["metadata"]["name"] = name
    doc["spec"]["replicas"] = 1  # on the host's network, one port: one of each
    for container in spec["containers"]:
        container["image"] = image
        given = {e["name"]: e["value"] for e in container.get("env", [])}
        container.pop("envFrom", None)
        port = {"PORT": env["PORT"]} if "PORT" in given else {}  # the host's port is ours
        container["env"] = [{"name": k, "value": v}
                            for k, v in {**env, **given, **port}.items()]
        container.pop("ports", None)  # the host's network: the process's own port
        for probe in ("readinessProbe", "livenessProbe"):
            container.pop(probe, None)  # podman runs probes with curl, which the image has not
    for volume in spec["volumes"]:
        if "secret" in volume:
            volume.pop("secret")
            volume["hostPath"] = {"path": str(key_dir), "type": "Directory"}
    return doc


def test_the_manifests_hold_what_a_cluster_needs():
    docs = documents()
    kinds = {kind for kind, _ in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "Job", "ConfigMap",
            "Secret"} <= kinds
    web = docs[("Deployment", "tollgate-web")]["spec"]["template"]["spec"]
    probes = web["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["securityContext"]["runAsNonRoot"] is True
    consumer = docs[("Deployment", "tollgate-consumer")]["spec"]["template"]["spec"]
    # Longer than a consumer's shutdown: it finishes or hands back its attempts first.
    assert consumer["terminationGracePeriodSeconds"] >= 60
    for kind, name in docs:
        if kind == "Deployment":
            for container in docs[(kind, name)]["spec"]["template"]["spec"]["containers"]:
                assert container["resources"]["requests"] and container["resources"]["limits"]
                assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_deployments_play_and_run_a_gated_run(stack, database, tmp_path):
    docs = documents()
    config = docs[("ConfigMap", "tollgate-config")]["data"]
    port = free_port()
    env = {**config, **database, "ALLOWED_HOSTS": "127.0.0.1", "PORT": str(port),
           "TOLLGATE_BASE_URL": f"http://127.0.0.1:{port}", "TOLLGATE_PROXY_COUNT": "0"}
    job = docs[("Job", "tollgate-migrate")]["spec"]["template"]["spec"]["containers"][0]
    stack.run(*job["command"])  # the Job's container, as a plain container
    key_dir = tmp_path / "audit"
    key_dir.mkdir()
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out",
                    str(key_dir / "audit-key.pem")], check=True, capture_output=True)
    (key_dir / "audit-key.pem").chmod(0o400)
    played = [playable(docs[("Deployment", name)], stack.image, env, key_dir,
                       f"{stack.prefix}-{name}")
              for name in ("tollgate-web", "tollgate-consumer")]
    manifest = tmp_path / "played.yaml"
    manifest.write_text(yaml.safe_dump_all(played))
    try:
        podman("kube", "play", str(manifest), timeout=300)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _ready(url), 120, 0.5, what="the web pod to be ready")
        except AssertionError as exc:
            names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
            logs = {n: podman("logs", n, check=False).stderr[-1500:]
                    for n in names if n.startswith(stack.prefix)}
            raise AssertionError(f"{exc}: {logs}") from None
        through_the_gate(lambda *args: stack.run("python", "manage.py", *args), url)
    finally:
        podman("kube", "down", str(manifest), check=False, timeout=120)


def _ready(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/readyz", timeout=3).status_code == 200
    except requests.RequestException:
        return False
