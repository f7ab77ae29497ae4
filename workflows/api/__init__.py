"""The workflows API for scripts and agents, one router per resource: `specs`, `runs`,
`steps` (the buttons) and `workers`; `schemas` holds the shapes they share."""
