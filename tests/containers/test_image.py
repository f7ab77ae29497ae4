"""The one image in each of its roles: the migration, the web app, the events server and
consumers, on PostgreSQL and Redis, as an operator starts them; a run from the API to its
end across containers; a consumer container killed mid-step; two consumers' metrics added
up; and the image itself: non-root, read-only root, a health check, `check --deploy`."""

from __future__ import annotations

import json
import subprocess

import requests

from ..support.attempts import logged_shell, overlaps, ran_to_the_end, read
from ..support.containers import podman
from ..support.processes import free_port, port_open, wait_for
from .conftest import METRICS_TOKEN, people, serve

SPEC = {"name": "boxed", "steps": [
    {"key": "build", "run": {"command": ["id", "-u"]}},
    {"key": "qa", "depends_on": ["build"], "approval": {"group": "qa"}},
    {"key": "ship", "depends_on": ["qa"], "run": {"shell": "echo shipped from $(uname -n)"}},
]}


def consumer(stack, role: str, **extra):
    """A consumer as compose.yaml runs it: root in its container only to start each command
    as the tollgate-steps account."""
    return stack.start(role, "python", "manage.py", "run_huey", "--workers", "2",
                       user="0:0", TOLLGATE_COMMAND_USER="tollgate-steps", **extra)


def load(stack, tmp_path, spec: dict) -> None:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / f"{spec['name']}.json").write_text(json.dumps(spec))
    podman("run", "--rm", "--network=host", "-v", f"{tmp_path / 'specs'}:/specs:ro",
           *stack._env({}), stack.image, "python", "manage.py", "load_workflow",
           f"/specs/{spec['name']}.json")


def status(api, run_id: int) -> dict:
    return api.get(f"/api/runs/{run_id}")


def test_the_image_is_non_root_read_only_checked_and_deploy_clean(image, database, tmp_path):
    assert podman("run", "--rm", image, "id", "-u").stdout.strip() == "10001"
    health = json.loads(podman("image", "inspect", image).stdout)[0]["Healthcheck"]
    assert "/healthz" in " ".join(health["Test"])
    key = tmp_path / "audit-key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)],
                   check=True, capture_output=True)
    key.chmod(0o600)  # root's, as a consumer's secret volume gives it
    production = {**database, "TOLLGATE_SSL_REDIRECT": "1", "TOLLGATE_SECURE_COOKIES": "1",
                  "ALLOWED_HOSTS": "tollgate.example.com",
                  "TOLLGATE_BASE_URL": "https://tollgate.example.com",
                  "TOLLGATE_AUDIT_KEY_FILE": "/run/secrets/audit-key.pem",
                  "TOLLGATE_VAPID_KEY_FILE": "/data/vapid-key.pem",
                  "TOLLGATE_VAPID_SUBJECT": "mailto:ops@example.com"}
    # The web app as itself; a consumer as root, starting commands as tollgate-steps.
    for user, extra in (("", {"TOLLGATE_ROLE": "web"}),
                        ("0:0", {"TOLLGATE_ROLE": "consumer",
                                 "TOLLGATE_COMMAND_USER": "tollgate-steps"})):
        checked = podman("run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network=host",
                         "-v", f"{key}:/run/secrets/audit-key.pem:ro",
                         *(["--user", user] if user else []),
                         *[a for k, v in {**production, **extra}.items()
                           for a in ("-e", f"{k}={v}")], image,
                         "python", "manage.py", "check", "--deploy", "--fail-level", "WARNING")
        assert "no issues" in checked.stdout, checked.stdout + checked.stderr


def test_a_run_goes_end_to_end_across_containers(stack, tmp_path):
    stack.run("python", "manage.py", "migrate", "--noinput")
    url = serve(stack)
    events = free_port()
    stack.start("events", "python", "manage.py", "serve_events", f"127.0.0.1:{events}")
    wait_for(lambda: port_open(events), 60, 0.25, what="the events server to listen")
    alice, bob = people(stack, url)
    load(stack, tmp_path, SPEC)
    consumer(stack, "consumer")
    run = alice.post("/api/runs", {"spec": "boxed"}, expect=201)
    gate = wait_for(lambda: next((s for s in status(alice, run["id"])["steps"]
                                  if s["key"] == "qa" and s["status"] == "waiting_approval"),
                                 None), 120, 0.25, what="the gate to open")
    bob.post(f"/api/runs/{run['id']}/steps/qa/approve",
             {"comment": "looks good", "seen": gate["evidence_digest"]})
    done = wait_for(lambda: (found := status(alice, run["id"]))["status"] == "completed"
                    and found, 120, 0.25, what="the run to complete")
    steps = {step["key"]: step for step in done["steps"]}
    # The command ran as tollgate-steps (10002), not as the consumer's root.
    timeline = alice.get(f"/api/runs/{run['id']}/timeline")
    outputs = json.dumps(timeline)
    assert "10002" in outputs and "shipped from" in outputs
    assert steps["ship"]["status"] == "completed"
    assert requests.get(f"{url}/healthz", timeout=5).text.strip() == "ok"
    # The image's own health check, run as the runtime runs it.
    assert podman("healthcheck", "run", f"{stack.prefix}-web").returncode == 0


def test_a_consumer_container_killed_mid_step_leaves_the_run_to_the_next_once(stack,
                                                                              tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log_dir.chmod(0o777)  # the commands write as tollgate-steps
    log = log_dir / "attempts.log"
    stack.run("python", "manage.py", "migrate", "--noinput")
    url = serve(stack)
    alice, _ = people(stack, url)
    spec = {"name": "killed", "steps": [
        {"key": "work", "max_retries": 3,
         "run": {"shell": logged_shell("/logs/attempts.log", 4)}}]}
    load(stack, tmp_path, spec)
    mounts = (f"{log_dir}:/logs",)
    first = stack.start("consumer-1", "python", "manage.py", "run_huey", "--workers", "2",
                        user="0:0", mounts=mounts, TOLLGATE_COMMAND_USER="tollgate-steps")
    run = alice.post("/api/runs", {"spec": "killed"}, expect=201)
    wait_for(lambda: read(log), 120, 0.1, what="the command to begin in the first container")
    stack.kill(first)  # podman kill: SIGKILL to the container's every process
    stack.start("consumer-2", "python", "manage.py", "run_huey", "--workers", "2",
                user="0:0", mounts=mounts, TOLLGATE_COMMAND_USER="tollgate-steps")
    wait_for(lambda: status(alice, run["id"])["status"] == "completed", 180, 0.25,
             what="the run to complete on the second container")
    ended = ran_to_the_end(log)
    assert overlaps(log) == [] and list(ended.values()) == [1], (read(log), ended)


def test_two_consumer_containers_write_metrics_that_add_up(stack, tmp_path):
    stack.run("python", "manage.py", "migrate", "--noinput")
    url = serve(stack)
    alice, _ = people(stack, url)
    load(stack, tmp_path, {"name": "counted", "steps": [
        {"key": "only", "run": {"command": ["true"]}}]})
    for role in ("consumer-1", "consumer-2"):  # each pid 1 in its own pid namespace
        name = consumer(stack, role)
        runs = [alice.post("/api/runs", {"spec": "counted"}, expect=201)["id"]
                for _ in range(3)]
        wait_for(lambda runs=runs: all(status(alice, r)["status"] == "completed"
                                       for r in runs), 120, 0.25, what=f"runs on {role}")
        stack.stop(name)
    scrape = requests.get(f"{url}/metrics", timeout=10,
                          headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    line = next(line for line in scrape.splitlines() if line.startswith(
        "tollgate_steps_total{") and 'spec="counted"' in line and 'event="completed"' in line)
    assert float(line.split()[-1]) == 6, line
