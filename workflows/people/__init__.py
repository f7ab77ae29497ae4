"""Policy and people: who may do what (`permissions`: the one place rules on people live) and
what a signed-in session carries (`sessions`)."""
