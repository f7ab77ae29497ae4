def inbox(request):
    """The count of gates waiting on the signed-in user, for the navigation."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    from .selectors import inbox_count

    return {"inbox_count": lambda: inbox_count(user)}
