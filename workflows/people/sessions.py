"""What a signed-in session carries that more than one part of Tollgate reads, named once:
the sign-in middleware writes these, and the pages that ask for a fresh proof of who this
is (adding a passkey, signing at the provider) read them."""

# When this session signed in (seconds since the epoch): stamped at every sign-in.
SIGNED_IN_AT = "tollgate_signed_in_at"
# A sign-in made again at the company's provider for a page that asked for a fresh proof
# of who this is (workflows.sso.views.sign): {"user": pk, "auth_time": when the provider
# says it signed them in}.
FRESH_SIGN_IN = "tollgate_sso_fresh_sign_in"
