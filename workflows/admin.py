import json

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db.models import Q

from workflows import engine
from workflows.models import (
    ApiToken,
    Approval,
    ChatIdentity,
    Checkpoint,
    Passkey,
    Preference,
    Run,
    Schedule,
    SpecOwner,
    SsoIdentity,
    Step,
    Webhook,
    WebhookDelivery,
    WorkflowSpec,
)
from workflows.people.permissions import can_change_specs, readable_runs, sees_every_run
from workflows.specs.storage import archive_versions, require_author, store_spec
from workflows.specs.validation import SpecError, masked, spec_problems, validate_spec
from workflows.timing import clock
from workflows.timing.schedules import (
    require_schedule_rights,
    save_schedule,
    slot_key,
    upcoming_slots,
)


class SpecForm(forms.ModelForm):
    """A spec's definition (JSON). Its name is the definition's own "name"; the Name field
    is for a definition written without one, and must agree with it when both are given."""

    name = forms.SlugField(
        required=False, max_length=100,
        help_text="Leave empty to use the definition's own \"name\"; fill it in only for a "
                  "definition without one.")

    class Meta:
        model = WorkflowSpec
        fields = ["name", "definition"]

    actor = None  # the signed-in user, set by the admin: loading specs has its own rules

    def clean(self):
        data = super().clean()
        definition = data.get("definition")
        if "definition" not in data:
            return data
        if not isinstance(definition, dict):
            raise forms.ValidationError(
                {"definition": "A spec must be a JSON object with name and steps."})
        named, written = data.get("name") or self.instance.name, definition.get("name")
        if named and written and named != written:
            raise forms.ValidationError({"name": (
                f"The definition names this spec “{written}”; leave Name empty (or the "
                f"same) rather than give a second name, “{named}”.")})
        if not (named or written):
            raise forms.ValidationError({"definition": (
                'The definition needs its name: add "name": "…" (or fill in Name).')})
        spec = {**definition, "name": named or written}
        problems = spec_problems(spec)
        if problems:  # every problem at once, not only the first
            raise forms.ValidationError({"definition": problems})
        try:
            data["definition"] = validate_spec(spec)
            require_author(self.actor, data["definition"])
        except SpecError as exc:
            raise forms.ValidationError({"definition": str(exc)}) from None
        except engine.NotPermitted as exc:
            raise forms.ValidationError(str(exc)) from None
        return data

    def _post_clean(self):
        pass  # storage (versioning) is store_spec's job, not the model's


@admin.action(description="Archive selected specs", permissions=["change"])
def archive_specs(modeladmin, request, queryset):
    count, refused = archive_versions(queryset, actor=request.user)
    modeladmin.message_user(request, f"{count} spec(s) archived.")
    for why in dict.fromkeys(refused):
        modeladmin.message_user(request, why, level=messages.ERROR)


@admin.register(WorkflowSpec)
class WorkflowSpecAdmin(admin.ModelAdmin):
    form = SpecForm
    list_display = ["name", "version", "status", "description", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "description"]
    actions = [archive_specs]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.actor = request.user
        return form

    # A version is never edited in place: with change rights, the change page edits a copy
    # of its definition and saving stores it as the next version (store_spec); without
    # them, the page is read-only and offers no Save.
    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        shown = ["name", "version", "status", "description", "created_at"]
        return shown if self.has_change_permission(request, obj) else [
            *shown, "pretty_definition"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["name", "definition"]
        if self.has_change_permission(request, obj):
            return [*self.get_readonly_fields(request, obj), "definition"]
        return self.get_readonly_fields(request, obj)

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:  # inline env values in clear only for those who may change specs
            obj.reveal_env = can_change_specs(request.user)
        return obj

    @admin.display(description="definition")
    def pretty_definition(self, obj):
        from django.utils.html import format_html

        shown = obj.definition if getattr(obj, "reveal_env", False) else masked(obj.definition)
        return format_html("<pre>{}</pre>", json.dumps(shown, indent=2))

    def save_model(self, request, obj, form, change):
        spec, created = store_spec(form.cleaned_data["definition"], actor=request.user)
        obj.pk, obj.version, obj.status = spec.pk, spec.version, spec.status
        if not created:
            self.message_user(request, f"{spec} is unchanged; no new version stored.",
                              messages.WARNING)
        elif change:
            self.message_user(request, f"Saved {spec.name!r} as version {spec.version}, now "
                                       "the active one; runs keep the version they started "
                                       "with.", messages.SUCCESS)
        else:
            self.message_user(request, f"Stored {spec.name!r} as version {spec.version}.",
                              messages.SUCCESS)

    def message_user(self, request, message, level=messages.INFO, *args, **kwargs):
        # Django's own "The workflow spec “release v2” was changed successfully" would name
        # the spec by a version and call a new version a change: save_model said it above.
        if level == messages.SUCCESS and ("was changed successfully" in str(message)
                                          or "was added successfully" in str(message)):
            return
        super().message_user(request, message, level, *args, **kwargs)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class StepInline(ReadOnlyInline):
    model = Step
    fk_name = "run"
    fields = ["index", "key", "kind", "status", "attempt", "approval_group", "lease_owner",
              "lease_expires_at", "holder_host", "holder_pid", "child_pid", "child_run",
              "last_summary"]
    readonly_fields = fields


class CheckpointInline(ReadOnlyInline):
    model = Checkpoint
    fields = ["seq", "kind", "step", "run_status", "step_status", "actor_name", "summary", "at"]
    readonly_fields = fields


@admin.action(description="Cancel selected runs", permissions=["operate"])
def cancel_runs(modeladmin, request, queryset):
    for run in queryset:
        try:
            engine.cancel_run(run, actor=request.user, reason="Cancelled from the admin")
        except engine.WorkflowError as exc:
            modeladmin.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "spec", "goal", "status", "requested_by", "created_at"]
    list_filter = ["status", "spec_name"]
    list_select_related = ["spec", "goal", "requested_by"]
    search_fields = ["title", "idempotency_key"]
    actions = [cancel_runs]
    inlines = [StepInline, CheckpointInline]
    readonly_fields = ["spec", "spec_name", "status", "requested_by", "idempotency_key",
                       "current_step", "next_action", "error", "shared_state", "created_at",
                       "started_at", "finished_at", "checkpoint_seq", "goal"]
    fields = ["title", "priority", *readonly_fields]

    def get_queryset(self, request):
        return readable_runs(request.user, super().get_queryset(request))

    def has_add_permission(self, request):
        return False  # runs are opened through the engine (web, API, start_run)

    def has_operate_permission(self, request):
        return request.user.has_perm("workflows.operate_run")

    def has_delete_permission(self, request, obj=None):
        return False

    def delete_view(self, request, object_id, extra_context=None):
        from django.shortcuts import redirect

        self.message_user(request, "Runs are never deleted: their checkpoints are the audit "
                                   "trail, and the database protects them. Cancel the run "
                                   "instead.", messages.ERROR)
        return redirect("admin:workflows_run_change", object_id)


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    """Decisions are the audit trail: read only, never deleted (the model refuses too)."""

    list_display = ["step", "attempt", "user", "on_behalf_of", "decision", "channel",
                    "chat_identity", "at"]
    list_filter = ["decision", "channel"]
    list_select_related = ["step", "user", "on_behalf_of"]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if sees_every_run(request.user):
            return queryset
        return queryset.filter(step__run__in=readable_runs(request.user))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.action(description="Revoke selected tokens", permissions=["change"])
def revoke_tokens(modeladmin, request, queryset):
    from django.utils import timezone

    count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
    modeladmin.message_user(request, f"{count} token(s) revoked.")


@admin.register(Preference)
class PreferenceAdmin(admin.ModelAdmin):
    """A person's time zone, their manager (a gate's `manager` rule) and, while they are
    away, their delegate: an admin sets these for anyone (the model's clean checks them)."""

    list_display = ["user", "manager", "delegate", "away_from", "away_until", "time_zone"]
    list_select_related = ["user", "manager", "delegate"]
    search_fields = ["user__username", "manager__username", "delegate__username"]
    autocomplete_fields = ["user", "manager", "delegate"]

    # A manager or a delegate decides someone else's gates: writing these needs
    # set_approval_power (superusers hold it), never the model's plain add or change.
    def _may_set(self, request) -> bool:
        return request.user.has_perm("workflows.set_approval_power")

    def has_add_permission(self, request):
        return self._may_set(request)

    def has_change_permission(self, request, obj=None):
        return self._may_set(request)

    def has_delete_permission(self, request, obj=None):
        return self._may_set(request)


@admin.register(Passkey)
class PasskeyAdmin(admin.ModelAdmin):
    """Passkeys are seen and removed here (a lost key), never made or edited: a public key
    set by anyone but its owner's browser would sign as that person."""

    list_display = ["name", "user", "created_at", "last_used_at", "sign_count"]
    list_select_related = ["user"]
    search_fields = ["name", "user__username"]
    fields = readonly_fields = ["user", "name", "created_at", "last_used_at", "sign_count"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "prefix"]
    autocomplete_fields = ["user"]
    actions = [revoke_tokens]

    def get_fields(self, request, obj=None):
        return ["user", "name"] if obj is None else ["user", "name", "prefix", "created_at",
                                                      "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request, obj=None):
        # Revocation is final: revoke with the action, never un-revoke by clearing a date.
        return [] if obj is None else ["user", "prefix", "created_at", "last_used_at",
                                       "revoked_at"]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is None and not request.user.is_superuser and "user" in form.base_fields:
            users = form.base_fields["user"]
            users.queryset = users.queryset.filter(pk=request.user.pk)
            users.initial = request.user.pk
            users.help_text = "Staff mint tokens for themselves; a superuser for anyone."
        return form

    def get_autocomplete_fields(self, request):
        return self.autocomplete_fields if request.user.is_superuser else []

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        token, raw = ApiToken.objects.issue(obj.user, obj.name, actor=request.user)
        obj.pk = token.pk
        self.message_user(request, f"New token for {obj.user}: {raw} (shown once; it is "
                                   "stored hashed).", messages.WARNING)


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["name", "spec_name", "goal", "cron", "interval_seconds", "timezone", "enabled",
                  "overlap", "missed", "reuse", "retry_limit", "retry_delay_seconds",
                  "shared_state", "params", "next_run_at", "until", "created_at"]

    actor = None  # the signed-in user, set by the admin: scheduling runs has its own rules

    def _post_clean(self):
        super()._post_clean()  # the instance now holds what was posted

        try:
            require_schedule_rights(self.instance, actor=self.actor)
        except engine.NotPermitted as exc:
            self.add_error(None, str(exc))


RECENT_SLOTS = 50


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.actor = request.user
        return form

    def save_model(self, request, obj, form, change):
        save_schedule(obj, actor=request.user)

    list_display = ["name", "spec_name", "cron", "interval_seconds", "timezone", "enabled",
                    "next_run_at", "missed_count", "skipped_count", "paused_reason"]
    list_filter = ["enabled", "overlap", "missed"]
    search_fields = ["name", "spec_name"]
    autocomplete_fields = ["goal"]
    readonly_fields = ["upcoming", "missed_count", "skipped_count", "last_run",
                       "paused_reason", "recent_slots"]

    @admin.display(description="Next runs")
    def upcoming(self, obj):
        """When the schedule starts its next runs, in its own zone and from now, or why it
        starts none."""
        from zoneinfo import ZoneInfo

        from django.utils.html import format_html_join
        from django.utils.timesince import timeuntil

        if obj is None or obj.pk is None:
            return "shown once the schedule is saved"
        if not obj.enabled:
            return obj.paused_reason or "none: the schedule is disabled"
        now = clock.now()
        slots = upcoming_slots(obj, now)
        if not slots:
            return f"none: no slot before its end ({obj.until:%Y-%m-%d %H:%M %Z})"
        zone = ZoneInfo(obj.timezone)
        return format_html_join(", ", "{} ({})", (
            (f"{slot.astimezone(zone):%Y-%m-%d %H:%M} {obj.timezone}",
             "due now" if slot <= now else f"in {timeuntil(slot, now)}")
            for slot in slots))

    @admin.display(description="Latest slots")
    def recent_slots(self, obj):
        """The latest slots handled: the run each started, or why it started none."""
        from django.utils.html import format_html, format_html_join

        fires = list(obj.fires.select_related("run").order_by("-slot_at")[:RECENT_SLOTS])
        # Every run of each slot, its retries included (one query).
        runs_of = {}
        for key, pk, status in (Run.objects.filter(schedule=obj, idempotency_key__in=[
                f"{slot_key(obj.pk, fire.slot_at)}{f':retry-{n}' if n else ''}"
                for fire in fires for n in range(fire.retries + 1)])
                .order_by("pk").values_list("idempotency_key", "pk", "status")):
            slot = key.split(":retry-")[0]
            runs_of.setdefault(slot, []).append(f"#{pk} ({status})")
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (f"{fire.slot_at:%Y-%m-%d %H:%M}",
             fire.get_outcome_display() + (f" ({fire.run.get_status_display().lower()})"
                                           if fire.run_id else ""),
             fire.reason, ", ".join(runs_of.get(slot_key(obj.pk, fire.slot_at), [])))
            for fire in fires))
        if not rows:
            return "none yet"
        return format_html("<table><tr><th>Slot</th><th>Outcome</th><th>Reason</th>"
                           "<th>Runs</th></tr>{}</table>", rows)


class WebhookForm(forms.ModelForm):
    """The secret is write-only: typed when set or changed, never shown again."""

    secret = forms.CharField(
        required=False, max_length=200, widget=forms.PasswordInput(render_value=False),
        help_text="Signs each post (HMAC-SHA256). Write-only: leave empty to keep the "
                  "current one.")

    class Meta:
        model = Webhook
        fields = ["group", "url", "secret", "active"]

    def clean_secret(self):
        secret = self.cleaned_data.get("secret", "")
        if not secret and not self.instance.pk:
            raise forms.ValidationError("A new webhook needs a secret.")
        return secret or self.instance.secret


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ["group", "url", "active", "created_at"]
    list_filter = ["active", "group"]
    search_fields = ["group", "url"]


@admin.register(SpecOwner)
class SpecOwnerAdmin(admin.ModelAdmin):
    """Whom each spec name belongs to (its versions, one-offs and added steps reach its
    granted secrets): a superuser changes it."""

    list_display = ["name", "user", "group", "created_at"]
    search_fields = ["name", "user__username", "group__name"]
    autocomplete_fields = ["user"]

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


@admin.register(SsoIdentity)
class SsoIdentityAdmin(admin.ModelAdmin):
    """Who signed in through the company's provider, as it last said. Written at sign-in;
    deleting one unlinks it (the next sign-in links by verified e-mail or makes an account)."""

    list_display = ["user", "issuer", "subject", "email", "email_verified", "last_sign_in"]
    list_select_related = ["user"]
    search_fields = ["user__username", "subject", "email", "object_id"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in SsoIdentity._meta.fields] if obj is not None else []

    def get_fields(self, request, obj=None):
        return ["user", "issuer", "subject"] if obj is None else [
            f.name for f in SsoIdentity._meta.fields if f.name != "id"]

    def has_add_permission(self, request):
        # Linking a company identity to an account signs that identity in as it: only a
        # superuser does it, as sign-on itself never joins an admin's account.
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ChatIdentity)
class ChatIdentityAdmin(admin.ModelAdmin):
    """Chat accounts and the Tollgate users they act as. Delete a wrong link; add one for a
    person whose chat e-mail does not match (they can also link themselves)."""

    list_display = ["user", "provider", "team", "chat_user", "name", "matched_by",
                    "created_at"]
    list_filter = ["provider", "matched_by"]
    list_select_related = ["user"]
    search_fields = ["user__username", "chat_user", "name"]
    autocomplete_fields = ["user"]
    readonly_fields = ["matched_by", "created_at"]

    def has_change_permission(self, request, obj=None):
        return False  # a link is made or removed, never moved to someone else

    # A linked account decides as its person: linking needs link_chat_identity (superusers
    # hold it), never the model's plain add.
    def has_add_permission(self, request):
        return request.user.has_perm("workflows.link_chat_identity")

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("workflows.link_chat_identity")

    def save_model(self, request, obj, form, change):
        obj.matched_by = "admin"
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """A record of each post: read only (Tollgate writes it)."""

    list_display = ["event", "webhook", "run", "status", "attempts", "last_status_code",
                    "next_attempt_at", "delivered_at"]
    list_filter = ["status", "event"]
    list_select_related = ["webhook", "run"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def get_queryset(self, request):
        """A delivery's payload is its run's: shown only where the run may be read."""
        queryset = super().get_queryset(request)
        if sees_every_run(request.user):
            return queryset
        return queryset.filter(Q(run__isnull=True) | Q(run__in=readable_runs(request.user)))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class PersonAdmin(UserAdmin):
    """People as Django's admin keeps them; one who ever acted in a run is never deleted."""

    def get_deleted_objects(self, objs, request):
        # Said at once, without collecting every checkpoint they wrote.
        acted = [person for person in objs if Checkpoint.objects.filter(actor=person).exists()
                 or Approval.objects.filter(user=person).exists()]
        if acted:
            return [], {}, set(), [
                f"{person}: acted in runs, and stays in their record. Deactivate them "
                "instead (untick “Active” on their page): they can no longer sign in, decide "
                "or use a token." for person in acted]
        return super().get_deleted_objects(objs, request)


admin.site.unregister(User)
admin.site.register(User, PersonAdmin)
