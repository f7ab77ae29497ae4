import re

import nh3
from django import template
from django.templatetags.static import static
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe
from markdown_it import MarkdownIt

from workflows.specs import values
from workflows.specs.values import readable

register = template.Library()

# Instructions are Markdown (CommonMark, tables), raw HTML off, then sanitised: what a spec
# author writes cannot run script or style the page, and links open safely.
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": True}).enable(
    ["table", "linkify"])
_TAGS = {"p", "br", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li", "a", "h1",
         "h2", "h3", "h4", "h5", "h6", "hr", "table", "thead", "tbody", "tr", "th", "td"}


@register.filter
def markdown(text) -> str:
    """Markdown for people (gate instructions), sanitised with nh3. Values filled into it
    (a `values.Filled`) go in after, as text: never a link or markup."""
    if isinstance(text, values.Filled):
        return mark_safe(text.render(_render(text.template), conditional_escape, HREF))
    return mark_safe(_render(str(text or "")))


HREF = re.compile(r'href="[^"]*"')


def _render(text: str) -> str:
    html = _MARKDOWN.render(text)
    return nh3.clean(html, tags=_TAGS, attributes={"a": {"href", "title"}},
                     url_schemes={"http", "https", "mailto"},
                     link_rel="noopener noreferrer nofollow")


@register.filter
def plain(text) -> str:
    """Instructions as plain text (a mail's text part): the values filled into them broken
    where a mail reader would make a link of them."""
    if isinstance(text, values.Filled):
        return text.render(text.template, values.unlinkable)
    return str(text or "")


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; autoescaping still applies."""
    return values.pretty_json(value)


@register.filter
def duration(value) -> str:
    """A timedelta (or seconds) for people: '12 s', '6 min', '1 h 5 min', '2 d 3 h'."""
    return values.duration(value)


@register.filter
def age(value) -> str:
    """How long ago a datetime was, compactly."""
    return duration(timezone.now() - value) if value else ""


@register.filter
def since(value):
    """How long ago a datetime was, in a <time> the page keeps counting (page.js); its title
    is the moment itself, in the viewer's zone."""
    if not value:
        return ""
    iso = value.isoformat()
    return format_html('<time datetime="{}" data-since="{}" title="{}">{}</time>', iso, iso,
                       date_format(timezone.localtime(value), "D j M Y, H:i T"), age(value))


@register.filter
def without(mapping, keys: str):
    """The dict without the comma-separated keys (output shown separately)."""
    if not isinstance(mapping, dict):
        return mapping
    drop = set(keys.split(","))
    return {k: v for k, v in mapping.items() if k not in drop}


@register.filter
def label(value) -> str:
    """A status or kind as words: waiting_approval -> waiting for approval."""
    return values.label(value)


@register.simple_tag(takes_context=True)
def htmx(context) -> str:
    """django-htmx's vendored htmx, with the page's CSP nonce, but never its DEBUG error
    handler: that one swaps the whole page for any 400/403, and Tollgate's 4xx answers to an
    htmx press are fragments meant for the page (the refusal shown where it happened)."""
    return format_html('<script src="{}" defer nonce="{}"></script>',
                       static("django_htmx/htmx-2.min.js"), context.get("csp_nonce", ""))


@register.filter
def countdown(due) -> str:
    """A deadline in words: "rejects itself in 3 h", "overdue by 5 min: it rejects itself at
    the next check". static/tollgate/countdown.js keeps the words true between updates."""
    if not due:
        return ""
    left = due["left"]
    if left >= 0:
        return f"{due['then']} in {duration(left)}"
    return f"overdue by {duration(-left)}: it {due['then']} at the next check"


@register.filter
def human(value) -> str:
    """A value as a person reads it (values.readable): yes/no for booleans, JSON for
    objects and lists."""
    return readable(value)


@register.filter
def has_passkey(user) -> bool:
    """Has this person a passkey to sign with? One query per request, however many gates
    the page shows (kept on the request's user)."""
    if not getattr(user, "is_authenticated", False):
        return False
    if not hasattr(user, "_has_passkey"):
        user._has_passkey = user.passkeys.exists()
    return user._has_passkey


@register.simple_tag
def sign_on() -> dict:
    """The company's sign-on as a login page offers it: set up, its name, and whether it is
    the only way in (the admin's own login page says so)."""
    from django.conf import settings

    return {"enabled": bool(settings.TOLLGATE_OIDC_ISSUER),
            "label": settings.TOLLGATE_OIDC_LABEL, "only": settings.TOLLGATE_OIDC_ONLY}


@register.filter
def signs_on(user) -> str:
    """The provider's name if this person can sign by signing in again there (sign-on set
    up, and an identity of theirs at it), else "". One query per request, kept on the
    request's user."""
    from django.conf import settings

    if not settings.TOLLGATE_OIDC_ISSUER or not getattr(user, "is_authenticated", False):
        return ""
    if not hasattr(user, "_signs_on"):
        user._signs_on = user.sso_identities.exists()
    return settings.TOLLGATE_OIDC_LABEL if user._signs_on else ""
