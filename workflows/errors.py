"""What the engine and the services below it raise: a change that cannot happen now;
nothing was changed. The web answers with each class's status code."""

from __future__ import annotations


class WorkflowError(Exception):
    """A transition that cannot happen now; nothing was changed."""

    status_code = 409


class IllegalTransition(WorkflowError):
    status_code = 409


class NotPermitted(WorkflowError):
    status_code = 403


class InvalidInput(WorkflowError):
    status_code = 400


class NotFound(WorkflowError):
    status_code = 404
