import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from workflows.models import ApiToken


class Api:
    """A JSON client acting with one user's Bearer token."""

    def __init__(self, user):
        self.user = user
        self.token = ApiToken.objects.issue(user, "tests")[1]
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {self.token}")

    def get(self, url, **params):
        return self.client.get(url, params)

    def post(self, url, data=None):
        return self.client.post(url, data if data is not None else {},
                                content_type="application/json")

    def patch(self, url, data):
        return self.client.patch(url, data, content_type="application/json")


@pytest.fixture
def api(people):
    """Clients for alice (requester and operator, may start runs and edit goals) and others."""
    alice = people["alice"]
    alice.user_permissions.add(*Permission.objects.filter(codename__in=[
        "add_run", "add_workflowspec", "author_command_spec", "add_goal", "change_goal"]))
    return {name: Api(user) for name, user in people.items()}
