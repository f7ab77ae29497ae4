from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError

from .models import CLOSED_GOAL_STATUSES, Goal, GoalStatus
from .services import (
    EDITABLE_FIELDS,
    OpenRuns,
    goal_closing,
    goal_save,
    goal_set_status,
    goal_update,
)


class ChildGoalInline(admin.TabularInline):
    model = Goal
    fk_name = "parent"
    fields = ["title", "status", "priority", "owner", "blocker_reason"]
    extra = 0
    show_change_link = True
    autocomplete_fields = ["owner"]


def _bulk_status(modeladmin, request, queryset, status: str, open_runs: str = "refuse"):
    changed, refused = 0, []
    for goal in queryset:
        try:
            goal_set_status(goal, status, actor=request.user, open_runs=open_runs)
            changed += 1
        except ValidationError as exc:
            refused.append(f"{goal}: {'; '.join(exc.messages)}")
        except PermissionDenied as exc:
            refused.append(f"{goal}: {exc}")
    if changed:
        modeladmin.message_user(request, f"{changed} goal(s) marked {status}.")
    for message in refused:
        modeladmin.message_user(request, message, messages.ERROR)


@admin.action(description="Mark selected goals completed", permissions=["change"])
def mark_completed(modeladmin, request, queryset):
    _bulk_status(modeladmin, request, queryset, GoalStatus.COMPLETED)


@admin.action(description="Mark selected goals abandoned", permissions=["change"])
def mark_abandoned(modeladmin, request, queryset):
    _bulk_status(modeladmin, request, queryset, GoalStatus.ABANDONED)


@admin.action(description="Mark selected goals completed and cancel their open runs",
              permissions=["change"])
def complete_and_cancel_runs(modeladmin, request, queryset):
    _bulk_status(modeladmin, request, queryset, GoalStatus.COMPLETED, open_runs="cancel")


@admin.action(description="Reopen selected goals (active)", permissions=["change"])
def reopen(modeladmin, request, queryset):
    _bulk_status(modeladmin, request, queryset, GoalStatus.ACTIVE)


class GoalAdminForm(forms.ModelForm):
    """Closing a goal whose runs are open asks what to do with them."""

    open_runs = forms.ChoiceField(
        label="Its open runs", required=False, initial="refuse",
        choices=[("refuse", "Keep the goal open while it has open runs"),
                 ("cancel", "Cancel them and close the goal")],
        help_text="Asked only when the goal is being closed.")

    class Meta:
        model = Goal
        fields = ["title", "objective", "parent", "owner", "priority", "status",
                  "blocker_reason", "next_action", "success_signal", "shared_state"]

    def clean(self):
        cleaned = super().clean()
        closing = (self.instance.pk and cleaned.get("status") in CLOSED_GOAL_STATUSES
                   and "status" in self.changed_data)
        if closing and cleaned.get("open_runs", "refuse") != "cancel":
            try:  # the same rule as every other way of closing a goal, asked first
                goal_closing.send(sender=Goal, goal=self.instance, actor=None,
                                  open_runs="refuse")
            except OpenRuns as exc:
                self.add_error("open_runs", exc.messages)
        return cleaned


@admin.register(Goal)
class GoalAdmin(admin.ModelAdmin):
    form = GoalAdminForm
    list_display = ["title", "parent", "status", "priority", "owner", "updated_at"]
    list_filter = ["status", "priority", ("owner", admin.RelatedOnlyFieldListFilter),
                   ("parent", admin.EmptyFieldListFilter)]
    list_select_related = ["parent", "owner"]
    search_fields = ["title", "objective", "next_action"]
    autocomplete_fields = ["parent", "owner"]
    readonly_fields = ["opened_by", "opened_at", "updated_at", "closed_at"]
    inlines = [ChildGoalInline]
    actions = [mark_completed, mark_abandoned, complete_and_cancel_runs, reopen]
    fieldsets = [
        (None, {"fields": ["title", "objective", "parent", "owner", "priority"]}),
        ("Progress", {"fields": ["status", "open_runs", "blocker_reason", "next_action",
                                 "success_signal"]}),
        ("State", {"fields": ["shared_state", "opened_by", "opened_at", "updated_at",
                             "closed_at"],
                   "classes": ["collapse"]}),
    ]

    def save_model(self, request, obj, form, change):
        """Through the goal services' rules; closing cancels the open runs if asked to."""
        if not change:
            goal_save(obj, actor=request.user)
            return
        changed = {name: getattr(obj, name) for name in form.changed_data
                   if name in EDITABLE_FIELDS}
        goal_update(obj, actor=request.user,
                    open_runs=form.cleaned_data.get("open_runs") or "refuse", **changed)
