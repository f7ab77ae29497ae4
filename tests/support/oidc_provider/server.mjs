// A real OpenID Connect provider for the sign-on tests: panva's oidc-provider with its
// development login page. Accounts and their groups are read from USERS_FILE on every sign-in,
// so a test changes someone's groups at the provider by rewriting that file.
//   PORT, USERS_FILE, CLIENT (JSON: client_id, client_secret, redirect_uris,
//   post_logout_redirect_uris)
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const client = JSON.parse(process.env.CLIENT);

function account(id) {
  const users = JSON.parse(readFileSync(process.env.USERS_FILE, 'utf8'));
  return users[id];
}

const provider = new Provider(issuer, {
  clients: [{
    ...client,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  // PKCE on every authorization, not only for public clients.
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username', 'given_name', 'family_name'],
    groups: ['groups'],
  },
  // The scopes' claims in the ID token too, as Keycloak and Okta put groups there.
  conformIdTokenClaims: false,
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  cookies: { keys: ['tollgate-tests-only'] },
  async findAccount(ctx, id) {
    const user = account(id);
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          email: user.email,
          email_verified: user.email_verified ?? true,
          preferred_username: user.username ?? id,
          name: user.name ?? id,
          given_name: user.given_name ?? '',
          family_name: user.family_name ?? '',
          groups: user.groups ?? [],
        };
      },
    };
  },
  // Consent is the provider's business; these tests are about Tollgate.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
});
// Someone removed here (gone from USERS_FILE) is signed out here too, as a real provider
// ends a disabled account's sessions: a silent (prompt=none) check then answers
// login_required instead of carrying on as them.
provider.use(async (ctx, next) => {
  if (ctx.path === '/auth') {
    const session = await provider.Session.get(ctx);
    if (session.accountId && !account(session.accountId)) {
      await session.destroy();
    }
  }
  await next();
});
provider.proxy = false;
// LISTEN_FD: a socket the tests opened on a port the OS chose, handed over already listening.
const where = process.env.LISTEN_FD ? { fd: Number(process.env.LISTEN_FD) } : port;
provider.listen(where, ...(process.env.LISTEN_FD ? [] : ['127.0.0.1']), () => {
  console.log(`listening ${issuer}`);
});
