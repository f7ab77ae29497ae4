"""The Start run form, built from a spec's declared params (validation is the engine's)."""

from __future__ import annotations

from django import forms

from goals.models import Goal


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
        choices = [("", "—")] if not common["required"] else []
        return forms.ChoiceField(choices=choices + [(o, o) for o in param["options"]], **common)
    if kind == "text":
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), max_length=10000,
                               strip=False, **common)
    return forms.CharField(max_length=500, **common)


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
