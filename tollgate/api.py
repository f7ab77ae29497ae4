"""The JSON API (`/api/`): authentication, the body parser and the error answers.

Authentication is a browser session (CSRF-checked) or `Authorization: Bearer <token>`; a token
acts with its user's permissions only. Every error is `{"error": "..."}` with a 4xx status.
The endpoints live in each app's `api.py` router; every write goes through the engine or the
goal services, which check who may act.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import wraps

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.http import Http404, JsonResponse
from django.utils import timezone
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth

from goals.api import router as goals_router
from goals.services import OpenRuns
from tollgate import dbfaults
from workflows.api import inbox, runs, specs, steps, workers
from workflows.engine import WorkflowError
from workflows.models import ApiToken
from workflows.people.permissions import vouched_for
from workflows.specs.values import BadValue, check_json


class TokenAuth(HttpBearer):
    def authenticate(self, request, token: str):
        found = (ApiToken.objects.select_related("user")
                 .filter(key_hash=ApiToken.hash(token), revoked_at__isnull=True).first())
        if found is None or not found.user.is_active or not vouched_for(found.user):
            return None
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > timedelta(seconds=60):
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        return found.user


class BrowserSession(SessionAuth):
    """The signed-in browser session, CSRF-checked; no session at all is a 401, not a 403."""

    def __call__(self, request):
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)


class StrictJson(Parser):
    """JSON as the database can store it: no NaN or Infinity, no NUL, bounded nesting."""

    def parse_body(self, request):
        body = request.body  # raises RequestDataTooBig past DATA_UPLOAD_MAX_MEMORY_SIZE
        if b"\x00" in body or b"\\u0000" in body:
            raise BadValue("NUL characters are not allowed in the request body.")
        try:
            data = json.loads(body, parse_constant=_refuse_constant)
        except RecursionError:
            raise BadValue("body: nested too deeply.") from None
        check_json(data, "body")
        if not isinstance(data, dict):
            raise BadValue(f"body: must be a JSON object, not {type(data).__name__} "
                           f"({json.dumps(data)[:40]}).")
        return data

    def parse_querydict(self, data, list_fields, request):
        for name, values in data.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                raise BadValue(f"{name.replace(chr(0), '')}: NUL characters are not allowed "
                               "in the query string.")
        return super().parse_querydict(data, list_fields, request)


def _refuse_constant(name: str):
    raise BadValue(f"body: {name} is not a JSON number; send a finite number or null.")


class TollgateAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        """The ids scripts generated clients from: the workflows routers were one module,
        `workflows.api`, when they were published, and keep its ids."""
        module = operation.view_func.__module__
        if module.startswith("workflows.api."):
            module = "workflows.api"
        return f"{module}_{operation.view_func.__name__}".replace(".", "_")

    def get_openapi_schema(self, *args, **kwargs):
        """As ninja writes it, but a body that may be left out is an object when sent: JSON
        null is not "no body" (every body must be an object)."""
        schema = super().get_openapi_schema(*args, **kwargs)
        for operations in schema["paths"].values():
            for operation in operations.values():
                body = (operation.get("requestBody") or {}).get("content", {}).get(
                    "application/json", {})
                choices = body.get("schema", {}).get("anyOf") or []
                if {"type": "null"} in choices and len(choices) == 2:
                    body["schema"] = next(c for c in choices if c != {"type": "null"})
        return schema


def docs_access(view):
    """The API's description and docs answer a signed-in person or a valid token, and
    anyone only where TOLLGATE_API_DOCS_PUBLIC says so: they list every route and field."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        if (settings.TOLLGATE_API_DOCS_PUBLIC or request.user.is_authenticated
                or TokenAuth()(request) is not None):
            return view(request, *args, **kwargs)
        return JsonResponse({"error": "Sign in (or send an API token) to read the API's "
                                      "description: it is not public here "
                                      "(TOLLGATE_API_DOCS_PUBLIC)."}, status=401)

    return guarded


api = TollgateAPI(title="Tollgate API", version="1", auth=[TokenAuth(), BrowserSession()],
               urls_namespace="api", parser=StrictJson(), docs_decorator=docs_access,
               description="Start runs, report progress, decide gates and read timelines. "
                           "Every body is a JSON object; no text in it, nor in a query "
                           "string, holds NUL (U+0000). "
                           "Names a body gives (a user, a group, a spec's parameter) must name "
                           "one that exists: a 400 says which does not.")


def error(request, message: str, status: int):
    return api.create_response(request, {"error": message}, status=status)


@api.exception_handler(WorkflowError)
def on_workflow_error(request, exc):
    body = {"error": str(exc)}
    if getattr(exc, "errors", None):  # a param or form field refused: each one, by name
        body["fields"] = exc.errors
    return api.create_response(request, body, status=exc.status_code)


@api.exception_handler(BadValue)
def on_bad_value(request, exc):
    return error(request, str(exc), 400)


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    from django.conf import settings

    return error(request, f"The request body is larger than "
                          f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.", 413)


@api.exception_handler(NinjaValidationError)
def on_invalid(request, exc):
    problems = []
    for item in exc.errors:
        where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "payload"))
        problems.append(f"{where}: {item.get('msg', 'invalid')}" if where else item.get("msg"))
    return error(request, "; ".join(problems) or "Invalid request.", 400)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return error(request, "Authentication required: a session or a valid, unrevoked "
                          "Bearer token.", 401)


@api.exception_handler(HttpError)
def on_http_error(request, exc):
    # Ninja wraps whatever the parser raised as "Cannot parse request body": say what it was.
    cause = exc.__cause__
    if isinstance(cause, RequestDataTooBig):
        return on_too_big(request, cause)
    if isinstance(cause, BadValue):
        return on_bad_value(request, cause)
    if isinstance(cause, json.JSONDecodeError):
        return error(request, f"The body is not valid JSON: {cause.msg} at line {cause.lineno} "
                              f"column {cause.colno}.", 400)
    return error(request, str(exc), exc.status_code)


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return error(request, str(exc) or "Not found.", 404)


@api.exception_handler(PermissionDenied)
def on_forbidden(request, exc):
    return error(request, str(exc) or "Not allowed.", 403)


@api.exception_handler(DjangoValidationError)
def on_model_invalid(request, exc):
    return error(request, "; ".join(exc.messages), 400)


@api.exception_handler(OpenRuns)
def on_goal_with_open_runs(request, exc):
    """Closing a goal whose runs are open is a conflict with the state, not bad input."""
    return error(request, "; ".join(exc.messages), 409)


RETRY_AFTER_SECONDS = 5


def on_database_away(request, exc):
    """The database is away (restarting, cut off, out of connections, locked): 503, never a
    500. A start that may have committed is safe to send again with its idempotency key."""
    from django.db import connection

    connection.close_if_unusable_or_obsolete()
    response = error(request, "The database is not answering; try again in a few seconds "
                              "(with the same idempotency key, a start is not repeated).", 503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


for away in dbfaults.AWAY:  # what dbfaults counts as the database away, and nothing else
    api.add_exception_handler(away, on_database_away)


@api.exception_handler(IntegrityError)
def on_conflict(request, exc):
    """A write the database refused as conflicting with one made at the same moment (or
    repeated across a restart): the request changed nothing, and may be sent again."""
    return error(request, "This conflicts with a change made at the same time; nothing was "
                          "changed. Read the resource again and retry.", 409)


@api.exception_handler(DataError)
def on_data_error(request, exc):
    return error(request, "A value is out of range or has characters the database refuses.", 400)


for router in (specs.router, runs.router, steps.router, inbox.router, workers.router):
    api.add_router("/", router)
api.add_router("/", goals_router)


def _json_not_allowed(view):
    """Ninja answers a method a path does not take with plain text: the API's own error
    body instead, naming the methods it takes (its Allow header stays)."""
    import functools

    from django.http import JsonResponse

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if response.status_code != 405 or response.get("Content-Type", "").startswith(
                "application/json"):
            return response
        allowed = response.get("Allow", "")
        answer = JsonResponse({"error": f"{request.method} is not taken here: use "
                                        f"{' or '.join(allowed.split(', ')) or 'another path'}."},
                              status=405)
        answer["Allow"] = allowed
        return answer

    return wrapped


def urls():
    """The API's URL patterns, open to LoginRequiredMiddleware: the API answers 401 itself."""
    from django.contrib.auth.decorators import login_not_required

    patterns, app_name, namespace = api.urls
    for pattern in patterns:
        pattern.callback = login_not_required(_json_not_allowed(pattern.callback))
    return patterns, app_name, namespace
