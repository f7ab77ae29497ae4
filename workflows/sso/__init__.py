"""Single sign-on with the company's OpenID Connect provider (Authlib's Django client:
discovery from the issuer, the authorization-code flow with PKCE, the ID token checked against
the provider's keys and the nonce). `accounts` makes and updates people from the claims;
`views` is the sign-in, callback and sign-out; `backends` keeps passwords for break-glass
accounts when sign-on is the only way in; `middleware` ends sessions past their age."""
