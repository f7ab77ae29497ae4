"""Chat presses under gunicorn: how long Slack and Teams wait for Tollgate's answer to a
press (Slack gives up after 3 s and shows the person an error; Teams after about 5 s), with
eight people pressing at once, beside /healthz's under the same load. Every press is checked
(signature or token), recorded and its doorbell rung before the answer, as in production."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

from bench.plumbing import gate_spec
from tests.support.processes import free_port, start_gunicorn, stop

CLIENTS = 8


def _timed(port: int, requests: list[tuple[str, bytes, dict]]) -> dict:
    """Send the requests from CLIENTS threads at once; each one's milliseconds."""
    import http.client

    pending, lock, took, failed = list(requests), threading.Lock(), [], []

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                if not pending:
                    return
                path, body, headers = pending.pop()
            started = time.perf_counter()
            conn.request("POST" if body is not None else "GET", path, body=body,
                         headers={"Host": "127.0.0.1", **headers})
            response = conn.getresponse()
            response.read()
            ms = (time.perf_counter() - started) * 1000
            with lock:
                (took if response.status < 400 else failed).append(ms)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    took.sort()

    def at(share):
        return took[min(len(took) - 1, int(share * len(took)))] if took else None

    return {"requests": len(took), "errors": len(failed), "rps": len(took) / elapsed,
            "p50_ms": statistics.median(took) if took else None, "p95_ms": at(0.95),
            "p99_ms": at(0.99), "max_ms": took[-1] if took else None}


def measure(bench) -> None:
    from django.contrib.auth.models import Group, User

    from tests.workflows.chat import fake_slack, fake_teams
    from workflows import engine
    from workflows.models import ChatIdentity, ChatInteraction

    spec = gate_spec()
    user, _ = User.objects.get_or_create(username="bench-chat")
    user.groups.add(Group.objects.get(name="bench-qa"))
    teams = fake_teams.FakeTeams()
    member = teams.member("bench")
    ChatIdentity.objects.get_or_create(provider="slack", team=fake_slack.TEAM,
                                       chat_user="U-BENCH", user=user, matched_by="link")
    ChatIdentity.objects.get_or_create(provider="teams", team=fake_teams.TENANT,
                                       chat_user=member["aadObjectId"], user=user,
                                       matched_by="link")
    gates = [engine.open_run(spec).run.steps.get(key="gate")
             for _ in range(bench.pick(40, 200, 400))]
    env = {**os.environ, **bench.env, **teams.settings(),
           "TOLLGATE_SLACK_BOT_TOKEN": fake_slack.TOKEN,
           "TOLLGATE_SLACK_SIGNING_SECRET": fake_slack.SIGNING_SECRET,
           # Nothing is posted: presses of linked people call neither platform back.
           "TOLLGATE_SLACK_API_URL": "http://127.0.0.1:9/api/"}
    token = teams.token()
    slack_presses, teams_presses = [], []
    for gate in gates:
        body = fake_slack.FakeSlack.body(fake_slack.button(gate, "approve", "U-BENCH", "bench"))
        slack_presses.append(("/chat/slack/interactions/", body,
                              fake_slack.FakeSlack.signed(body)))
        teams_presses.append(("/chat/teams/messages/", json.dumps(teams.activity(
            gate, "tollgate.approve", member)).encode(), {
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}))
    port = free_port()
    web = start_gunicorn(env, port, workers=4)
    try:
        _timed(port, [("/healthz", None, {})] * 40)  # every worker warm
        floor = _timed(port, [("/healthz", None, {})] * (2 * len(gates)))
        slack = _timed(port, slack_presses)
        teams_result = _timed(port, teams_presses)
    finally:
        stop(web, sig=15)
        teams.stop()
    recorded = ChatInteraction.objects.count()
    if recorded != len(gates) * 2 or slack["errors"] or teams_result["errors"]:
        raise RuntimeError(f"presses lost or refused: {recorded} recorded of "
                           f"{2 * len(gates)}; {slack}, {teams_result}")
    bench.results["chat"] = {"clients": CLIENTS, "gunicorn_workers": 4,
                             "floor_healthz": floor, "slack": slack, "teams": teams_result,
                             "limit_ms": {"slack": 3000, "teams": 5000}}
