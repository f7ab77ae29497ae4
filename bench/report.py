"""The table `make bench` prints: every figure beside its floor, target and peer."""

from __future__ import annotations


def verdict(value: float, target: float, *, at_most: bool = True) -> str:
    """"ok", or how far a figure misses its target."""
    met = value <= target if at_most else value >= target
    if met:
        return "ok"
    return f"misses {value / target:.1f}x" if at_most else f"misses {target / value:.1f}x"


def table(results: list[dict]) -> str:
    """Every figure beside its target and its verdict ("ok" or by how much it misses)."""
    width = 30
    lines = [f"{'measure':<46}" + "".join(f"{r['backend']:>{width}}" for r in results)
             + "   target"]

    def row(label, fn, target=""):
        cells = []
        for r in results:
            try:
                cells.append(fn(r))
            except (KeyError, TypeError, ZeroDivisionError, IndexError, ValueError):
                cells.append("-")
        lines.append(f"{label:<46}" + "".join(f"{c:>{width}}" for c in cells)
                     + (f"   {target}" if target else ""))

    def per_step(r):
        linear = r["linear"]
        return (f"{linear['per_step_ms']:.2f} ({linear['ratio_to_floor']:.1f}x, "
                f"{verdict(linear['ratio_to_floor'], 1.5)})")

    row("floor: UPDATE+INSERT transaction ms", lambda r: f"{r['floor']['transaction_pair_ms']:.2f}")
    row("raw Huey chain: ms per hop", lambda r: f"{r['floor']['huey_chain_hop_ms']:.2f}")
    row("DBOS 3.4 linear no-op steps: ms/step",
        lambda r: f"{r['dbos']['linear']:.2f}" if r["dbos"]["linear"] else "skipped")
    row("linear no-op steps: ms/step (x floor)", per_step, "<= 1.5x floor")
    row("linear: x DBOS (below 1 is faster)",
        lambda r: (f"{r['linear']['ratio_to_dbos']:.2f}x "
                   f"({verdict(r['linear']['ratio_to_dbos'], 0.5)})")
        if r["linear"]["ratio_to_dbos"] else "skipped", "<= 0.5x DBOS")
    row("fan-out: steps/s (DBOS)",
        lambda r: f"{r['fan_out']['steps_per_s']:.0f} ({_or_skipped(r['dbos']['fan_out'])})")
    row("short runs: steps/s (DBOS)",
        lambda r: f"{r['runs']['steps_per_s']:.0f} ({_or_skipped(r['dbos']['runs'])})")
    row("audit chain: step / approval, x without it",
        lambda r: f"{r['audit']['step_ratio']:.2f}x / {r['audit']['approval_ratio']:.2f}x "
                  f"({verdict(max(r['audit']['step_ratio'], r['audit']['approval_ratio']), 1.1)})",
        "<= 1.1x")
    row("  audit chain: hashing us/checkpoint",
        lambda r: f"{r['audit']['hash_us_per_checkpoint']:.0f}")
    row("step path profile: engine/django/driver",
        lambda r: "/".join(f"{r['profile']['layers'].get(k, 0) * 100:.0f}%"
                           for k in ("tollgate", "django", "database driver")))
    def replayed(r, how):
        replay = r["profile"]["replay"]
        floor = r["floor"]["transaction_pair_ms"]
        ms = replay[how]["ms_per_step"]
        return f"{ms:.2f} ({ms / floor:.1f}x, {verdict(ms / floor, 1.5)})"

    row("  in process: engine ms/step; statements/step",
        lambda r: f"{r['profile']['replay']['engine_ms_per_step']:.2f}; "
                  f"{r['profile']['replay']['statements_per_step']:.1f}")
    row("  its statements replayed: ms/step (x floor)",
        lambda r: replayed(r, "as_sent"), "<= 1.5x floor")
    row("  one round trip a transaction: ms/step",
        lambda r: replayed(r, "one_round_trip") if r["backend"] == "postgres" else "n/a",
        "<= 1.5x floor")
    row("  replayed: db CPU ms/step as sent / one trip",
        lambda r: f"{r['profile']['replay']['as_sent']['database_cpu_ms_per_step']:.2f} / "
                  f"{r['profile']['replay']['one_round_trip']['database_cpu_ms_per_step']:.2f}"
        if r["backend"] == "postgres" else "n/a")
    def versions(r):
        cpu = r["profile"]["row_versions"]["database_cpu_ms"]
        return (f"{cpu['floor_pair']:.2f} / {cpu['two_rows']:.2f} / {cpu['three_rows']:.2f} / "
                f"{cpu['five_rows']:.2f}")

    row("  a step's writes, db CPU ms: floor / 2 / 3 / 5 rows",
        lambda r: versions(r) if r["backend"] == "postgres" else "n/a", "<= 0.4")
    row("beside a backlog: start / end ms",
        lambda r: f"{r['fairness']['first_step_started_ms']['median']:.0f} / "
                  f"{r['fairness']['completed_ms']['median']:.0f}", "200 / 1000")
    row("approve -> next step started: median ms",
        lambda r: f"{r['approval_round_trip_ms']['median']:.1f}", "<= 25")
    row("approve -> next step started: p95 ms",
        lambda r: f"{r['approval_round_trip_ms']['p95']:.1f} "
                  f"({verdict(r['approval_round_trip_ms']['p95'], 60)})", "<= 60")
    for index in range(5):
        row(f"scale-out #{index + 1}: consumers x threads, group",
            lambda r, i=index: "{consumers} x {threads}, {group_commit_steps}".format(
                **r["scaleout"]["rows"][i]))
        row("  steps/s, raw ceiling tps",
            lambda r, i=index: "{:.0f}, {:.0f}".format(
                r["scaleout"]["rows"][i]["steps_per_s"],
                r["scaleout"]["rows"][i]["raw_ceiling_tps"]))
        row("  share of ceiling",
            lambda r, i=index: "{:.0%} ({})".format(
                r["scaleout"]["rows"][i]["fraction_of_ceiling"],
                verdict(r["scaleout"]["rows"][i]["fraction_of_ceiling"], 0.5, at_most=False)),
            ">= 50%")
        row("  CPU ms/step consumer, db; writes/step",
            lambda r, i=index: "{:.1f}, {:.1f}; {:.2f}".format(
                r["scaleout"]["rows"][i]["consumer_cpu_ms_per_step"],
                r["scaleout"]["rows"][i]["postgres_cpu_ms_per_step"],
                r["scaleout"]["rows"][i]["write_transactions_per_step"]))
    row("scale-out: DBOS queue steps/s",
        lambda r: f"{r['scaleout']['dbos_queue']['steps_per_s']:.0f}")
    row("pages at size: goals / runs / checkpoints",
        lambda r: f"{r['pages']['goals'] // 1000}k / {r['pages']['runs'] // 1000}k / "
                  f"{r['pages']['checkpoints'] / 1e6:.2f}M")
    for page in ("inbox", "goal_tree", "goal_page", "progress", "run_page", "run_search",
                 "run_search_rare"):
        row(f"{page}: queries small -> large, median ms",
            lambda r, p=page: f"{r['pages']['small'][p]['queries']} -> "
                              f"{r['pages']['large'][p]['queries']}, "
                              f"{r['pages']['large'][p]['median']:.1f} "
                              f"({verdict(r['pages']['large'][p]['median'], 50)})",
            "same, <= 50")
    row("goal rollup equals its runs (tallies)",
        lambda r: "yes" if r["pages"]["rollup_matches_runs"] else "NO")
    row("progress weeks equal their runs (day rows)",
        lambda r: "yes" if r["pages"]["progress_matches_runs"] else "NO")
    row("run search uses the trigram index",
        lambda r: "yes" if r["pages"]["search_plan"]["trigram_index"] else "no (scan)")
    row("sweep 1000 expired: s at N, 10N steps",
        lambda r: f"{r['sweeper']['sweep_s'][0]:.2f}, {r['sweeper']['sweep_s'][1]:.2f}",
        "flat, <= 2")
    row("sweep 1000 expired, one per run: s",
        lambda r: f"{r['sweeper']['sweep_one_per_run_s']:.2f}", "<= 2")
    row("expired-lease scan ms at N, 10N",
        lambda r: f"{r['sweeper']['scan_ms'][0]:.1f}, {r['sweeper']['scan_ms'][1]:.1f}")
    row("deadline task, 200 gates: s at N, 10N",
        lambda r: f"{r['sweeper']['deadlines_200_gates_s'][0]:.2f}, "
                  f"{r['sweeper']['deadlines_200_gates_s'][1]:.2f}", "flat")
    row("HTTP /healthz floor req/s", lambda r: f"{r['http']['floor_healthz']['rps']:.0f}")
    row("HTTP signed-in write, no engine: req/s (x floor)",
        lambda r: f"{r['http']['authenticated_write']['rps']:.0f} "
                  f"({r['http']['ratio_to_floor']['authenticated_write']:.2f}x)")
    # Targets: an approve from the inbox at 0.4x the floor, from the run page (which sends
    # the whole run back) at 0.3x.
    for name, label, target in (("run_page", "run page", None),
                                 ("approve_from_inbox", "approve (inbox)", 0.4),
                                 ("approve", "approve (run page)", 0.3)):
        row(f"HTTP {label} req/s (x floor)",
            lambda r, n=name, t=target: f"{r['http'][n]['rps']:.0f} "
            f"({r['http']['ratio_to_floor'][n]:.2f}x"
            + (f", {verdict(r['http']['ratio_to_floor'][n], t, at_most=False)})" if t else ")"),
            f">= {target}x" if target else "")
    row("500 open inboxes, nothing changed: cores",
        lambda r: f"{r['http']['inbox_polls']['cores_for_500_inboxes']:.2f} "
                  f"({r['http']['inbox_polls']['web_cpu_ms_per_poll']:.2f}+"
                  f"{r['http']['inbox_polls']['database_cpu_ms_per_poll']:.2f} ms/poll, 1 s; "
                  f"{verdict(r['http']['inbox_polls']['cores_for_500_inboxes'], 0.2)})",
        "<= 0.2")
    row("  before: polled from the database each 5 s",
        lambda r: f"{r['http']['inbox_polls']['database_polls']['cores_for_500_inboxes']:.2f} "
                  f"({r['http']['inbox_polls']['database_polls']['web_cpu_ms_per_poll']:.1f}+"
                  f"{r['http']['inbox_polls']['database_polls']['database_cpu_ms_per_poll']:.1f}"
                  " ms/poll)")
    row("change -> open inbox: median / max ms",
        lambda r: f"{r['http']['change_to_open_inbox_ms']['median']:.0f} / "
                  f"{r['http']['change_to_open_inbox_ms']['max']:.0f} "
                  f"({verdict(r['http']['change_to_open_inbox_ms']['max'], 1000)})",
        "<= 1000")
    row("500 open inboxes with streams: cores",
        lambda r: f"{r['http']['event_streams']['cores_for_500_inboxes']:.3f} "
                  f"({r['http']['event_streams']['events_server_cores']:.3f} server + "
                  f"{r['http']['event_streams']['fallback_poll_cores']:.3f} polls each 30 s; "
                  f"{verdict(r['http']['event_streams']['cores_for_500_inboxes'], 0.2)})",
        "<= 0.2")
    def streamed(r):
        return r["http"]["event_streams"]["change_to_open_inbox_ms"]

    row("change -> inbox by its stream: median/max ms",
        lambda r: f"{streamed(r)['median']:.0f} / {streamed(r)['max']:.0f} "
                  f"({verdict(streamed(r)['max'], 1000)})",
        "<= 1000")
    row("chat, 8 at once: /healthz p50 / p95 ms",
        lambda r: f"{r['chat']['floor_healthz']['p50_ms']:.0f} / "
                  f"{r['chat']['floor_healthz']['p95_ms']:.0f}")
    for name, label in (("slack", "Slack"), ("teams", "Teams")):
        row(f"chat, 8 at once: {label} press answered p50 / p95 ms",
            lambda r, n=name: f"{r['chat'][n]['p50_ms']:.0f} / {r['chat'][n]['p95_ms']:.0f} "
                              f"({verdict(r['chat'][n]['p95_ms'], 3000)})",
            "p95 <= 3000")
    row("soak: consumer RSS MB per round",
        lambda r: " ".join(f"{mb:.0f}" for mb in r["soak"]["rss_mb"]))
    row("soak: growth after warm-up",
        lambda r: f"{r['soak']['growth_after_warmup'] * 100:+.1f}%", "<= +10%")
    row("storage: bytes per finished run (5 steps)",
        lambda r: f"{r['storage']['bytes_per_run']:.0f} "
                  f"({r['storage']['checkpoints_per_run']:.0f} checkpoints)")
    return "\n".join(lines)


def _or_skipped(value) -> str:
    return f"{value:.0f}" if value else "skipped"
