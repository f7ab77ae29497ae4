"""The workflows API for scripts and agents, one router per resource: `specs`, `runs`,
`steps` (the buttons), `inbox` (the gates waiting on the caller, as they see them) and
`workers`; `schemas` holds the shapes they share."""
