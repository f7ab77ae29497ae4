"""Attempt logs: each command step appends its attempt's start, a tick every tenth of a second
while it runs, and its end to a file, so a test can prove that no two attempts of one step were
alive at the same time (a killed attempt's last tick is when it last ran)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def logged_shell(log: Path, seconds: float) -> str:
    """A shell line that works for `seconds`, leaving start, tick and end lines in `log`."""
    mark = ('echo "$TOLLGATE_RUN_ID $TOLLGATE_STEP_KEY $TOLLGATE_ATTEMPT {} $(date +%s.%N)" '
            f">> {log}")
    ticks = max(int(seconds * 10), 1)
    return (f"{mark.format('start')}; i=0; while [ $i -lt {ticks} ]; do sleep 0.1; "
            f"{mark.format('tick')}; i=$((i+1)); done; {mark.format('end')}")


def read(log: Path) -> dict[tuple[str, str], list[dict]]:
    """{(run id, step key): [{"attempt", "start", "last", "ended"}, ...]}, by start time."""
    found: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    if not log.exists():
        return {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue  # a line cut short by a kill
        run_id, key, attempt, what, at = parts
        entry = found[(run_id, key)].setdefault(attempt, {"attempt": attempt, "ended": False})
        moment = float(at)
        if what == "start":
            entry["start"] = moment
        entry["last"] = max(entry.get("last", moment), moment)
        entry["ended"] = entry["ended"] or what == "end"
    return {step: sorted((a for a in attempts.values() if "start" in a),
                         key=lambda a: a["start"])
            for step, attempts in found.items()}


def overlaps(log: Path) -> list[str]:
    """Attempts of one step that were alive at the same time."""
    found = []
    for (run_id, key), attempts in read(log).items():
        for earlier, later in zip(attempts, attempts[1:], strict=False):
            if earlier["last"] > later["start"]:
                found.append(f"run {run_id} step {key}: attempt {earlier['attempt']} ran "
                             f"until {earlier['last']:.2f}, attempt {later['attempt']} began "
                             f"{later['start']:.2f}")
    return found


def ran_to_the_end(log: Path) -> dict[tuple[str, str], int]:
    """How many attempts of each step ran to their end."""
    return {step: sum(a["ended"] for a in attempts) for step, attempts in read(log).items()}
