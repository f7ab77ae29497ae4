"""Specs as stored: versions, one active per name, and who may load or change them."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from workflows.errors import NotFound, NotPermitted
from workflows.models import SpecOwner, SpecStatus, WorkflowSpec
from workflows.people import permissions

from . import grants
from .validation import SpecError, digest, validate_spec


def require_author(actor, definition: dict) -> None:
    """A person loading specs needs add_workflowspec, and author_command_spec for a spec that
    runs commands or shell on the workers. The system (None or a name) may load any."""

    if not permissions.is_person(actor):
        return
    if not permissions.has(actor, permissions.LOAD_SPECS):
        raise NotPermitted(f"{actor.get_username() or 'anonymous'} may not load specs.")
    require_program_author(actor, definition)


def require_program_author(actor, definition: dict) -> None:
    """Steps that run programs on the workers (in a spec, or added to a run) need a person to
    hold author_command_spec. The system (None or a name) may."""

    if permissions.is_person(actor) and permissions.runs_programs(definition) and not (
            permissions.has(actor, permissions.AUTHOR_COMMANDS)):
        raise NotPermitted(f"{actor.get_username() or 'anonymous'} may not add steps that run "
                           "commands or shell: that needs the author_command_spec permission.")


def require_owner(actor, name: str) -> None:
    """A person writes a spec name (a new version, a one-off, steps added to its runs) only
    if it is theirs: unclaimed (they claim it), owned by them or a group of theirs, or they
    are a superuser. A granted secret is reached only by whom its spec name belongs to.
    Call inside the transaction that writes."""
    if not permissions.is_person(actor) or actor.is_superuser:
        return
    owner = SpecOwner.objects.select_related("user", "group").filter(name=name).first()
    if owner is None:
        if WorkflowSpec.objects.filter(name=name).exists():
            raise NotPermitted(f"Spec {name!r} belongs to the admins (loaded by a command or "
                               "before names had owners): an admin can make it yours (admin, "
                               "Spec owners).")
        # A fresh name that a secret's grant covers ("release-*") would hand its secrets to
        # whoever named it first: an admin gives it an owner.
        if reaching := grants.grants_reaching(name):
            raise NotPermitted(f"Spec name {name!r} is granted secrets (TOLLGATE_SECRET_GRANTS "
                               f"{reaching[0]!r}): only an admin can give it an owner (admin, "
                               "Spec owners), nobody claims it by loading it first.")
        # Two first loads at once: the unique name lets one claim it; the other is judged
        # against whoever did.
        owner, claimed = SpecOwner.objects.select_related("user", "group").get_or_create(
            name=name, defaults={"user": actor})
        if claimed:
            return
    if owner.user_id == actor.pk or (
            owner.group_id and actor.groups.filter(pk=owner.group_id).exists()):
        return
    raise NotPermitted(f"Spec {name!r} belongs to {owner.user or owner.group or 'the admins'}:"
                       f" {actor.get_username()} may not load versions of it, run it inline "
                       "or add steps to its runs (an admin can change its owner).")


def _last_version(name: str) -> int:

    return (WorkflowSpec.objects.filter(name=name).order_by("-version")
            .values_list("version", flat=True).first() or 0)


def _create_version(definition: dict, spec_digest: str, version: int, **fields):
    """A new version row (the (name, version) constraint refuses a taken version)."""

    return WorkflowSpec.objects.create(
        name=definition["name"], version=version, description=definition["description"],
        definition=definition, digest=spec_digest, **fields)


def store_spec(data, *, actor=None) -> tuple[WorkflowSpec, bool]:  # noqa: F821
    """Validate and store a spec. Returns (spec, created); unchanged specs are not re-stored."""

    definition = validate_spec(data)
    require_author(actor, definition)
    declared = data.get("version")
    spec_digest = digest(definition)
    for _ in range(3):
        try:
            with transaction.atomic():
                current = (
                    WorkflowSpec.objects.select_for_update()
                    .filter(name=definition["name"], status=SpecStatus.ACTIVE)
                    .first()
                )
                if current is not None and current.digest == spec_digest and (
                        declared in (None, current.version)):
                    return current, False
                require_owner(actor, definition["name"])
                last = _last_version(definition["name"])
                if declared is not None and declared != last + 1:
                    raise SpecError(f"spec {definition['name']!r}: version {declared} is not "
                                    f"the next one; expected {last + 1} (or leave "
                                    "version out)")
                WorkflowSpec.objects.filter(
                    name=definition["name"], status=SpecStatus.ACTIVE
                ).update(status=SpecStatus.ARCHIVED)
                return _create_version(definition, spec_digest, last + 1), True
        except IntegrityError:
            continue  # a concurrent load took this version; look again
    raise SpecError(f"spec {definition['name']!r}: too many concurrent loads, try again")


def store_one_off(data, *, actor=None):
    """A run's inline steps, stored as a one-off version of the spec they name: validated and
    authorised like any spec, never the active version. The same steps sent again (a
    repeated start) find the version stored the first time."""

    definition = validate_spec(data)
    require_author(actor, definition)
    spec_digest = digest(definition)
    for _ in range(3):
        found = WorkflowSpec.objects.filter(name=definition["name"], status=SpecStatus.ONE_OFF,
                                            digest=spec_digest).first()
        if found is not None:
            return found
        try:
            with transaction.atomic():
                require_owner(actor, definition["name"])
                return _create_version(definition, spec_digest,
                                       _last_version(definition["name"]) + 1,
                                       status=SpecStatus.ONE_OFF)
        except IntegrityError:
            continue  # a concurrent load took this version; look again
    raise SpecError(f"spec {definition['name']!r}: too many concurrent loads, try again")


def set_spec_status(name: str, version: int, status: str, *, actor=None):
    """Archive a spec version, or make it the active one (archiving the version that was).
    Needs workflows.change_workflowspec for a person."""

    if permissions.is_person(actor) and not permissions.has(
            actor, "workflows.change_workflowspec"):
        raise NotPermitted(f"{actor.get_username() or 'anonymous'} may not change specs.")
    with transaction.atomic():
        spec = WorkflowSpec.objects.select_for_update().filter(name=name, version=version).first()
        if spec is None:
            raise NotFound(f"No spec {name} v{version}.")
        require_owner(actor, name)  # which version runs is the name's owner's to say
        if status == SpecStatus.ACTIVE:
            WorkflowSpec.objects.filter(name=name, status=SpecStatus.ACTIVE).exclude(
                pk=spec.pk).update(status=SpecStatus.ARCHIVED)
        spec.status = status
        spec.save(update_fields=["status"])
        return spec


def archive_versions(specs, *, actor=None) -> tuple[int, list[str]]:
    """Archive each of these versions that the actor may (set_spec_status); returns (how
    many were archived, why each other one was not)."""
    archived, refused = 0, []
    for spec in specs:
        try:
            set_spec_status(spec.name, spec.version, SpecStatus.ARCHIVED, actor=actor)
            archived += 1
        except (NotPermitted, NotFound) as exc:
            refused.append(str(exc))
    return archived, refused
