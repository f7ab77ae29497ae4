"""What the signature tests share: a gate that must be signed, and a signed-in client."""

from __future__ import annotations

import pytest
from django.test import Client

from workflows import engine
from workflows.specs.storage import store_spec

MEANING = "Approved for release"


@pytest.fixture
def signed_gate(people):
    """alice's "Release 2.0" run, its qa gate waiting for a signed decision; bob (qa) is
    Bob Builder."""
    spec = store_spec({"name": "signed", "steps": [
        {"key": "qa", "approval": {"group": "qa", "signature": {"meaning": MEANING}}}]})[0]
    people["bob"].first_name, people["bob"].last_name = "Bob", "Builder"
    people["bob"].save()
    return engine.open_run(spec, actor=people["alice"], title="Release 2.0").run


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client
