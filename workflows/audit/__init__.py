"""The audit chain: each checkpoint carries the hash of the one before it in its run and its
own hash over its fields, so an edit, a deletion or a re-ordering made behind the
application's back (by a database user) is found by `manage.py verify_audit`, and an
exported timeline can be checked offline (`scripts/verify-audit-export`)."""
