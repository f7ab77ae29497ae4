"""The command supervisor's judgement of how an attempt ended."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from workflows.workers import supervise


class ExitedBeforeItsFirstLook(supervise.Supervisor):
    """A supervisor whose command has already exited (not yet reaped) when its loop first
    looks, as when the command ends just before the fence time and the look comes late."""

    def start(self) -> None:
        super().start()
        os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)  # exited, still reapable


def supervise_until_done(tmp_path, code: str, fence_at: float, kind=supervise.Supervisor):
    """Supervise `python -c code` in this process, its worker alive; its result."""
    (tmp_path / "spec.json").write_text(json.dumps({"argv": [sys.executable, "-c", code],
                                                    "env": {}, "fence_at": fence_at}))
    lifeline, keep = os.pipe()  # the worker's end stays open: its worker lives
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        kind(lifeline, str(tmp_path), 1.0).run()
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        os.close(keep)
        os.close(lifeline)
    return json.loads((tmp_path / "result.json").read_text())


def test_a_command_that_exited_before_its_fence_was_judged_finished(tmp_path):
    """The fence time passed before the supervisor looked, but the command had exited by
    then on its own: it finished (exit 0, nothing stopped), rather than being taken for a
    fenced attempt and run again."""
    result = supervise_until_done(tmp_path, "pass", time.monotonic() - 1,
                                  ExitedBeforeItsFirstLook)
    assert result["exit_code"] == 0 and result["stopped"] == ""


def test_a_command_still_running_at_its_fence_is_stopped(tmp_path):
    result = supervise_until_done(tmp_path, "import time; time.sleep(60)", time.monotonic() - 1)
    assert result["stopped"] == "fenced" and result["signal"] == signal.SIGTERM
