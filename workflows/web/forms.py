"""The Start run form, built from a spec's declared params (validation is the engine's)."""

from __future__ import annotations

from django import forms
from django.contrib.auth.models import Group
from django.forms.utils import ErrorDict

from goals.models import Goal
from workflows.models import WorkflowSpec


class InboxView(forms.Form):
    """The inbox's order and filters, read from its URL (?sort=deadline|age, ?group=,
    ?spec=, ?goal=); a value that is not one of them is refused by name."""

    sort = forms.ChoiceField(required=False, choices=[("age", "Waiting longest"),
                                                      ("deadline", "Deadline soonest")])
    group = forms.CharField(required=False, max_length=150)
    spec = forms.SlugField(required=False, max_length=100, label="Workflow")
    goal = forms.ModelChoiceField(required=False, queryset=Goal.objects.all())

    def clean_group(self):
        group = self.cleaned_data["group"]
        if group and not Group.objects.filter(name=group).exists():
            raise forms.ValidationError(f"there is no group named “{group}”.")
        return group

    def clean_spec(self):
        spec = self.cleaned_data["spec"]
        if spec and not WorkflowSpec.objects.filter(name=spec).exists():
            raise forms.ValidationError(f"there is no workflow named “{spec}”.")
        return spec

    def view(self) -> dict:
        """The valid parts (a refused one is left out, and its error shown)."""
        return {name: value for name, value in self.cleaned_data.items()
                if name not in self.errors and value}


def field_for(param: dict) -> forms.Field:
    """A Django form field for one declared param; the engine coerces and checks again."""
    common = {"label": param["label"], "help_text": param.get("description", ""),
              "required": param["required"] and "default" not in param,
              "initial": param.get("default")}
    kind = param["type"]
    if kind == "boolean":
        return forms.BooleanField(**{**common, "required": False})
    if kind == "number":
        return forms.FloatField(**common)
    if kind == "choice":
        # Without a default, nothing is chosen until someone chooses (a required one says so).
        choices = [("", "—")] if "default" not in param else []
        return forms.ChoiceField(choices=choices + [(o, o) for o in param["options"]], **common)
    if kind == "text":
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), max_length=10000,
                               strip=False, **common)
    return forms.CharField(max_length=500, **common)


class GateForm(forms.Form):
    """The fields a gate's approvers fill in (approval.form), prefixed `field_`; the engine
    coerces and checks the values again. Ids carry the gate's id: a page shows many."""

    def __init__(self, fields: list[dict], gate_id: int, *args, errors: dict | None = None,
                 **kwargs):
        super().__init__(*args, auto_id=f"gate{gate_id}-%s", **kwargs)
        self.declared = fields
        for field in fields:
            self.fields[f"field_{field['name']}"] = field_for(field)
            # What an approver typed stays while the page around it updates (htmx).
            self.fields[f"field_{field['name']}"].widget.attrs["hx-preserve"] = "true"
        if errors is not None:  # the engine refused the values: its words, beside each field
            self._errors = ErrorDict({f"field_{name}": self.error_class([problem])
                                      for name, problem in errors.items()
                                      if f"field_{name}" in self.fields})


def gate_form(gate, data=None, errors: dict | None = None) -> GateForm | None:
    """The form a gate's approvers fill in, if its spec gives it one."""
    fields = (gate.config or {}).get("approval", {}).get("form")
    return GateForm(fields, gate.pk, data, errors=errors) if fields else None


def posted_values(data) -> dict:
    """The `field_` values of a posted gate form, by field name (the engine types them)."""
    return {name[6:]: value for name, value in data.items() if name.startswith("field_")}


class StartRunForm(forms.Form):
    """Goal, title and idempotency key, then one field per param (prefixed `param_`)."""

    title = forms.CharField(max_length=200, required=False,
                            help_text="Why this run (shown to approvers).")
    goal = forms.ModelChoiceField(Goal.objects.exclude(status__in=["completed", "abandoned",
                                                                   "cancelled"])
                                  .order_by("title"), required=False)
    idempotency_key = forms.CharField(max_length=200, required=False,
                                      help_text="Send the same key twice and only one run "
                                                "starts.")

    def __init__(self, *args, params: list[dict], **kwargs):
        super().__init__(*args, **kwargs)
        self.params = params
        for param in params:
            self.fields[f"param_{param['name']}"] = field_for(param)

    def param_values(self) -> dict:
        """The params as the engine takes them (an unset optional field is left out)."""
        values = {}
        for param in self.params:
            value = self.cleaned_data.get(f"param_{param['name']}")
            if param["type"] == "number" and value is not None and float(value).is_integer():
                value = int(value)
            if value not in (None, "") or param["type"] == "boolean":
                values[param["name"]] = value
        return values


class AwayForm(forms.Form):
    """While you are away: from when, until when (in your time zone), and who decides your
    gates meanwhile (their username)."""

    away_from = forms.DateTimeField(label="Away from", widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    away_until = forms.DateTimeField(label="Back on", widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    delegate = forms.CharField(label="My gates go to", max_length=150,
                               help_text="The username of the person who decides for you.")

    def clean_delegate(self):
        from django.contrib.auth import get_user_model

        name = self.cleaned_data["delegate"].strip()
        found = get_user_model().objects.filter(username=name, is_active=True).first()
        if found is None:
            raise forms.ValidationError(f"There is no active person named {name!r}.")
        return found
