"""Helpers for your own tests of the workflows you run on Tollgate (pytest or unittest, on
your test database):

- `moved_clock()`: Tollgate's clock held still and moved by hand, so deadlines, reminders,
  escalations and digests come due at once (`clock.advance(hours=25)`, then `run_due()`);
- `recorded_sends()`: what Tollgate would send (mail, Slack, Teams, push) kept in memory
  instead, and `deliver_outbox()` to deliver what transitions owe now;
- `run_to_next_gate(run)`: the run's worker steps run in this process, as a consumer runs
  them, until a gate waits or nothing is ready.

    from workflows import engine, testing

    def test_release_waits_for_qa(release_spec, alice):
        run = engine.open_run(release_spec, actor=alice).run
        with testing.recorded_sends() as sent, testing.moved_clock() as clock:
            gates = testing.run_to_next_gate(run)
            testing.deliver_outbox()
            assert [g.key for g in gates] == ["qa"] and sent.mail_to("bob@example.com")
            clock.advance(days=2)
            testing.run_due()  # the deadline passed: the gate rejected itself
"""

from workflows.testing.clock import MovedClock, moved_clock, run_due
from workflows.testing.runs import run_to_next_gate
from workflows.testing.sends import RecordingChat, Sends, deliver_outbox, recorded_sends

__all__ = ["MovedClock", "RecordingChat", "Sends", "deliver_outbox", "moved_clock",
           "recorded_sends", "run_due", "run_to_next_gate"]
