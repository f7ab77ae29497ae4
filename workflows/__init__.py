"""Tollgate's workflow runtime. What other code may import from `workflows` is named in
`__all__` (pinned by tests/workflows/test_public_surface.py): the engine's verbs and its
errors, the spec loader, the reads pages and the API are made of, and `testing` for your own
tests. Each name is imported when first asked for: the package itself loads before Django's
apps are ready."""

from importlib import import_module

_PUBLIC = {
    # The transition engine's verbs: every status change goes through one of these.
    "workflows.engine": [
        "open_run", "add_steps", "cancel_run", "approve", "reject", "decide_many",
        "reassign_gate", "start_step", "complete_step", "fail_step", "retry_step",
        "skip_step", "record_note"],
    "workflows.errors": [
        "WorkflowError", "InvalidInput", "NotFound", "NotPermitted", "IllegalTransition"],
    # Specs: stored (validated, versioned) from their JSON or YAML as data.
    "workflows.specs.storage": ["store_spec"],
    "workflows.specs.validation": ["validate_spec"],
    # Reads: runs as the runs page and GET /api/runs filter them, a run's timeline, where a
    # run stands, its audit, and how many gates wait on a person.
    "workflows.reads.selectors": ["runs", "timeline", "resume_state", "run_audit", "inbox_count"],
    # The gate as a person sees it: the gates waiting on them, and what they see and may do
    # of any gates (the inbox, the run page, GET /api/inbox read it).
    "workflows.reads.gates": ["waiting_on", "seen_by"],
}
_OWNER = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted([*_OWNER, "testing"])


def __getattr__(name: str):
    if name == "testing":
        return import_module("workflows.testing")
    if name in _OWNER:
        return getattr(import_module(_OWNER[name]), name)
    raise AttributeError(f"module 'workflows' has no attribute {name!r}")


def __dir__():
    return __all__
