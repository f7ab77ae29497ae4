"""Approvals where people already are: a gate that waits is posted to its group's chat
channel with its essentials and Approve / Reject buttons; every press goes through the same
engine call as the web, under the same rules, and the message follows the gate wherever it is
decided.

- `base`: the small interface a chat platform implements (`ChatProvider`), and the neutral
  gate message, press and person's view every platform shares.
- `slack`, `teams`: one module per platform (docs/approvers.md, "Approvals in chat"); `providers`
  names the ones set up.
- `messages`: post and update a gate's messages (the outbox's "chat" job).
- `interactions`: a press received (verified, recorded, acknowledged) and handled after.
- `identities`: which Tollgate user a chat account acts as.
"""
