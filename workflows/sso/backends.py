from __future__ import annotations

from django.contrib.auth.backends import ModelBackend

from .accounts import password_allowed


class PasswordBackend(ModelBackend):
    """Django's password sign-in, for every form that asks (the login page, the admin's),
    refused to all but break-glass accounts when sign-on is the only way in."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is not None and not password_allowed(username):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
