"""The engine's two signals; the engine imports nothing above it, its listeners do.

`transition_recording` is sent inside a transaction, as the runs it changed are written,
with `announcements`: the transitions recorded since those runs were last written (a
transaction's transitions of many runs, a sweeper's batch or a worker's group commit, go in
one call). A receiver writes what they owe the outside world (the outbox) in the same
transaction, and notes what to tell once it commits.

`transition_committed` is sent once a transition's transaction has committed, with
`announcement`: the dispatcher rings the queue.
"""

from __future__ import annotations

from django.dispatch import Signal

transition_recording = Signal()
transition_committed = Signal()
