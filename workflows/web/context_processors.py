import functools

from workflows.people.permissions import can_export_audit
from workflows.reads.selectors import inbox_count


def inbox(request):
    """The count of gates waiting on the signed-in user, for the navigation."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    # Read once per response, however many places show it.
    return {"inbox_count": functools.cache(lambda: inbox_count(user)),
            "can_export_audit": lambda: can_export_audit(user),
            # Staff with no admin rights would find nothing there: no link for them.
            "show_admin": lambda: user.is_staff and (user.is_superuser
                                                     or bool(user.get_all_permissions()))}
