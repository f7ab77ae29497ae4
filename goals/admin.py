from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError

from .models import Goal, GoalStatus
from .services import goal_set_status


class ChildGoalInline(admin.TabularInline):
    model = Goal
    fk_name = "parent"
    fields = ["title", "status", "priority", "owner", "blocker_reason"]
    extra = 0
    show_change_link = True
    autocomplete_fields = ["owner"]


def _bulk_status(modeladmin, request, queryset, status: str) -> None:
    changed, refused = 0, []
    for goal in queryset:
        try:
            goal_set_status(goal, status, actor=request.user)
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


@admin.action(description="Reopen selected goals (active)", permissions=["change"])
def reopen(modeladmin, request, queryset):
    _bulk_status(modeladmin, request, queryset, GoalStatus.ACTIVE)


@admin.register(Goal)
class GoalAdmin(admin.ModelAdmin):
    list_display = ["title", "parent", "status", "priority", "owner", "updated_at"]
    list_filter = ["status", "priority", ("owner", admin.RelatedOnlyFieldListFilter),
                   ("parent", admin.EmptyFieldListFilter)]
    list_select_related = ["parent", "owner"]
    search_fields = ["title", "objective", "next_action"]
    autocomplete_fields = ["parent", "owner"]
    readonly_fields = ["opened_at", "updated_at", "closed_at"]
    inlines = [ChildGoalInline]
    actions = [mark_completed, mark_abandoned, reopen]
    fieldsets = [
        (None, {"fields": ["title", "objective", "parent", "owner", "priority"]}),
        ("Progress", {"fields": ["status", "blocker_reason", "next_action", "success_signal"]}),
        ("State", {"fields": ["shared_state", "opened_at", "updated_at", "closed_at"],
                   "classes": ["collapse"]}),
    ]
