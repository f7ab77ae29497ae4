import json
from datetime import timedelta

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; autoescaping still applies."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@register.filter
def duration(value) -> str:
    """A timedelta as '1h 2m', '3m 4s' or '1.2s'."""
    if value is None:
        return ""
    if not isinstance(value, timedelta):
        return str(value)
    seconds = value.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s"


@register.filter
def age(value) -> str:
    """How long ago a datetime was, compactly."""
    return duration(timezone.now() - value) if value else ""


@register.filter
def without(mapping, keys: str):
    """The dict without the comma-separated keys (output shown separately)."""
    if not isinstance(mapping, dict):
        return mapping
    drop = set(keys.split(","))
    return {k: v for k, v in mapping.items() if k not in drop}


@register.filter
def label(value) -> str:
    """A status or kind as words: waiting_approval -> waiting approval."""
    return str(value or "").replace("_", " ")
