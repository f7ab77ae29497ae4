"""The Prometheus endpoint, scraped while a real consumer runs steps: counters move,
histograms fill, and the web process's and the consumer's values add up."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.workflows.consumers import wait_for
from workflows import engine
from workflows.models import Run
from workflows.specs.storage import store_spec

pytestmark = [pytest.mark.django_db(transaction=True)]


def value(text: str, name: str, **labels) -> float:
    """The sample of `name` with these labels in a scrape (0 if absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{(.*)\}})? (\S+)$", line)
        if match and ",".join(sorted((match.group(2) or "").split(","))) == wanted:
            return float(match.group(3))
    return 0.0


@pytest.mark.consumer
def test_metrics_move_while_a_consumer_runs_steps(consumers):
    store_spec({"name": "metered", "steps": [
        {"key": f"s{i}", "run": {"callable": "workflows.callables.noop"},
         **({"depends_on": [f"s{i - 1}"]} if i else {})} for i in range(3)]})
    client = Client()
    before = client.get("/metrics").content.decode()
    consumers(workers=1)
    runs = [engine.open_run("metered").run for _ in range(2)]
    # The consumer counts in its own files; this process's scrape adds them up.
    wait_for(lambda: all(Run.objects.get(pk=r.pk).status == "completed" for r in runs), 60,
             what="the runs to finish")
    text = client.get("/metrics").content.decode()
    labels = {"spec": "metered", "kind": "run"}
    assert value(text, "tollgate_steps_total", event="completed", **labels) - value(
        before, "tollgate_steps_total", event="completed", **labels) == 6
    assert value(text, "tollgate_step_duration_seconds_count", **labels) >= 6
    assert value(text, "tollgate_claim_latency_seconds_count") >= 1
    assert "tollgate_gates_waiting" in text and "tollgate_steps_ready" in text
    assert "tollgate_periodic_last_run_seconds_ago" in text


def test_multiprocess_values_add_up_and_the_endpoint_is_guarded(settings, release_spec):
    from tests.workflows.helpers import work

    run = engine.open_run(release_spec).run
    work(run, "build")  # counted in this process
    text = Client().get("/metrics").content.decode()
    assert value(text, "tollgate_steps_total", spec="release", kind="run",
                 event="completed") >= 1
    assert value(text, "tollgate_gates_waiting") == 1
    assert value(text, "tollgate_sweeper_late") == 1  # no sweep has run in this test
    outside = Client(REMOTE_ADDR="203.0.113.9")
    assert outside.get("/metrics").status_code == 403
    settings.TOLLGATE_METRICS_TOKEN = "s3cret"
    assert outside.get("/metrics").status_code == 403
    assert outside.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_the_grafana_dashboard_names_only_metrics_that_exist():
    import json
    from pathlib import Path

    from workflows.ops import metrics

    root = Path(__file__).resolve().parents[3]
    dashboard = json.loads((root / "docs" / "grafana-dashboard.json").read_text())
    source = Path(metrics.__file__).read_text()
    names = {re.sub(r"_(bucket|count|sum)$", "", name)
             for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"tollgate_\w+", target["expr"])}
    assert names and all(f'"{name}"' in source for name in names), names


@pytest.mark.consumer
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="pid namespaces need root")
def test_consumers_in_containers_on_one_node_keep_their_metrics_apart(consumers, tmp_path):
    """Two consumers, each pid 1 in a pid namespace of its own, write to one metrics folder:
    each writes files of its own (host, namespace and pid in the name), so a scrape adds
    their counts up, and a consumer started beside a corrupt file still starts."""
    import os

    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "counter_1.db").write_bytes(b"\x00" * 3)  # what a crash mid-write leaves
    env = {"PROMETHEUS_MULTIPROC_DIR": str(folder)}
    store_spec({"name": "boxed", "steps": [
        {"key": "s", "run": {"callable": "workflows.callables.noop"}}]})
    for box in ("box-a", "box-b"):  # each runs four, the first gone when the second starts
        consumer = consumers(workers=1, container=box, **env)
        runs = [engine.open_run("boxed").run for _ in range(4)]
        wait_for(lambda runs=runs: all(Run.objects.get(pk=r.pk).status == "completed"
                                       for r in runs), 60, what=f"the runs to finish on {box}")
        consumer.kill()
    written = sorted(name for name in os.listdir(folder) if name.startswith("counter_box-"))
    assert {name.split("-")[1] for name in written} == {"a", "b"}, written
    os.environ["PROMETHEUS_MULTIPROC_DIR"], before = str(folder), os.environ[
        "PROMETHEUS_MULTIPROC_DIR"]
    try:
        text = Client().get("/metrics").content.decode()
    finally:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = before
    assert value(text, "tollgate_steps_total", spec="boxed", kind="run",
                 event="completed") == 8


def test_the_alert_rules_pass_their_cases_and_name_only_metrics_that_exist():
    """deploy/prometheus: promtool checks the rules and runs each alert's case; every metric
    an alert reads is one Tollgate serves (or Prometheus's own `up`)."""
    import shutil
    import subprocess
    from pathlib import Path

    from workflows.ops import metrics

    folder = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
    assert shutil.which("promtool"), "promtool (Debian's prometheus package) runs the cases"
    for args in (["check", "rules", "tollgate-rules.yaml"],
                 ["test", "rules", "tollgate-rules.test.yaml"]):
        done = subprocess.run(["promtool", *args], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    source = Path(metrics.__file__).read_text()
    rules = (folder / "tollgate-rules.yaml").read_text()
    names = set(re.findall(r"tollgate_\w+(?=[{\s)])", rules))
    assert len(names) >= 8 and all(f'"{name}"' in source for name in names), names
