"""Signing in with a real OpenID Connect provider (`tests/oidc.py`: oidc-provider-mock in its own
process) through the real router: the provider set up with `llmgw ctl signin oidc` (tried first,
its client secret sealed and never shown back), the whole redirect dance, and every way it must
not sign anyone in: a tampered state, a code used twice, another client's code, a token for
another audience, one past its time, one whose signature was touched, a name that is a local
user's, a user in no mapped group. No secret, code or token in a log line, an event or a KV value."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit

import aiohttp
import httpx
import msgspec
import pytest

from llmgw.bus import BadRequest, call
from llmgw.gguf import write_random_llama
from llmgw.proto import BUCKETS, Empty, people
from llmgw.proto.people import OidcSettings, SignInSettings, Tenant, UserCreate
from llmgw.router.accounts.oidc import LEEWAY_S, OidcError, Provider, begin, check_id_token
from tests.fleets import serve_router
from tests.oidc import Provider as OidcProvider
from tests.oidc import code_for

CLIENT_SECRET = "client-secret-that-must-never-show-9f3a"
ADA = {"sub": "ada-1", "email": "ada@example.com", "preferred_username": "ada.l", "groups": ["ml-team"]}
GRACE = {"sub": "grace-7", "email": "grace@example.com", "groups": ["other"]}
ROOT = {"sub": "root-2", "preferred_username": "root", "groups": ["ml-team"]}


@pytest.fixture(scope="module")
def provider():
    running = OidcProvider([ADA, GRACE, ROOT])
    yield running
    running.stop()


def _ctl(nats_server, *words: str, stdin: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
async def served(serve, nc, tmp_path, provider, nats_server):
    got = await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"))
    await call(nc, people.TENANT_PUT, Tenant(name="research", by="t"))
    wrong = await asyncio.to_thread(
        _ctl, nats_server, "signin", "oidc", "http://127.0.0.1:1", "--client-id", "llmgw", "--secret-stdin", stdin="x\n"
    )
    assert wrong.returncode == 1 and "not kept: provider: failed: http://127.0.0.1:1/.well-known" in wrong.stderr
    words = ["signin", "oidc", provider.url, "--client-id", "llmgw", "--label", "Example SSO", "--secret-stdin"]
    words += ["--group", "ml-team=research:operator"]
    kept = await asyncio.to_thread(_ctl, nats_server, *words, stdin=CLIENT_SECRET + "\n")
    assert kept.returncode == 0, kept.stderr
    assert (
        f"provider: {provider.url} answered: sign-in at {provider.url}/oauth2/authorize, 1 signing keys" in kept.stderr
    )
    return got


async def _start(browser: httpx.AsyncClient) -> str:
    """Begin a sign-in: the provider's authorization URL the console sends the browser to."""
    sent = await browser.get("/console/signin/provider?next=/console/models")
    assert sent.status_code == 303, sent.text[:300]
    return sent.headers["location"]


def _back_path(location: str) -> str:
    parts = urlsplit(location)
    return f"{parts.path}?{parts.query}"


async def test_a_provider_user_signs_in_with_its_groups_roles_and_nothing_secret_shows(
    served, nc, nats_server, capfd, provider
):
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the test's own client logs each URL it asks
    browser = httpx.AsyncClient(base_url=served.router.http.url, timeout=30)
    page = await browser.get("/console/signin")
    assert "Sign in with Example SSO" in page.text
    authorize = await _start(browser)
    asked = parse_qs(urlsplit(authorize).query)
    assert asked["code_challenge_method"] == ["S256"] and asked["client_id"] == ["llmgw"] and asked["nonce"]
    back = await asyncio.to_thread(code_for, authorize, "ada-1")
    code = parse_qs(urlsplit(back).query)["code"][0]
    landed = await browser.get(_back_path(back))
    assert landed.status_code == 200 and "Signed in as ada-l." in landed.text, landed.text[:500]
    assert 'http-equiv="refresh" content="0;url=/console/models"' in landed.text
    models = await browser.get("/console/models")
    assert models.status_code == 200 and "Fleet" in models.text
    ada = served.router.accounts.people.user("ada-l")
    assert (ada.source, ada.roles, ada.subject) == ("oidc", {"research": "operator"}, f"{provider.url} ada-1")

    # the same answer again: the pending sign-in was used, so nothing signs in
    again = httpx.AsyncClient(base_url=served.router.http.url, timeout=30, cookies=browser.cookies)
    replayed = await again.get(_back_path(back))
    assert replayed.status_code == 400 and "has ended already" in replayed.text
    # the used code under a fresh sign-in's state: the provider refuses it
    fresh = parse_qs(urlsplit(await _start(again)).query)["state"][0]
    reused = await again.get(f"/console/signin/provider/back?code={code}&state={fresh}")
    assert reused.status_code == 401 and "the provider refused the code (400 invalid_grant)" in reused.text

    shown = await asyncio.to_thread(_ctl, nats_server, "signin", "show")
    assert "client_secret: kept" in shown.stdout and CLIENT_SECRET not in shown.stdout
    out, err = capfd.readouterr()
    kv = await nc.jetstream().key_value(BUCKETS["settings"])
    stored = (await kv.get("signin")).value.decode()
    trail = await call(nc, people.AUDIT_LOG, people.AuditQuery(area="signin"))
    for secret in (CLIENT_SECRET, code):
        assert secret not in out + err and secret not in stored and secret not in str(trail)
    assert (
        '"client_secret":""' in trail.entries[0].after
        and '"secrets_kept":["oidc.client_secret"]' in trail.entries[0].after
    )


async def test_a_tampered_state_or_a_sign_in_not_started_here_signs_nobody_in(served):
    browser = httpx.AsyncClient(base_url=served.router.http.url, timeout=30)
    back = await asyncio.to_thread(code_for, await _start(browser), "ada-1")
    query = parse_qs(urlsplit(back).query)
    tampered = await browser.get(f"/console/signin/provider/back?code={query['code'][0]}&state=forged")
    assert tampered.status_code == 400 and "its state differs" in tampered.text
    assert "llmgw_console" not in tampered.cookies
    stranger = httpx.AsyncClient(base_url=served.router.http.url, timeout=30)
    foreign = await stranger.get(_back_path(back))  # another browser holding the link
    assert foreign.status_code == 400 and "not started in this browser" in foreign.text
    denied = await browser.get("/console/signin/provider/back?error=access_denied")
    assert denied.status_code == 400  # its pending sign-in went with the tampered answer


async def test_a_name_taken_here_or_no_mapped_group_is_refused(served, nc):
    await call(nc, people.USER_CREATE, UserCreate(name="root", tenant="research", role="admin", by="t"))
    for sub, said in (("root-2", "which is another user"), ("grace-7", "in no group mapped to a tenant")):
        browser = httpx.AsyncClient(base_url=served.router.http.url, timeout=30)
        back = await asyncio.to_thread(code_for, await _start(browser), sub)
        refused = await browser.get(_back_path(back))
        assert refused.status_code == 403 and said in refused.text
    assert served.router.accounts.people.user("root").source == "local"


async def test_another_clients_token_an_expired_one_and_a_touched_one_do_not_hold(provider):
    settings = OidcSettings(issuer=provider.url, client_id="other-app", client_secret="whatever")
    async with aiohttp.ClientSession() as http:
        found = await Provider.discover(settings, http)
    begun = begin(settings, found, "http://127.0.0.1/back")
    back = await asyncio.to_thread(code_for, begun.url, "ada-1")
    token = await found.redeem(settings, parse_qs(urlsplit(back).query)["code"][0], begun, "http://127.0.0.1/back")
    claims = check_id_token(token, found, "other-app", begun.nonce)
    assert claims["sub"] == "ada-1"
    with pytest.raises(OidcError, match="aud"):
        check_id_token(token, found, "llmgw", begun.nonce)  # a token another app was given
    with pytest.raises(OidcError, match="nonce"):
        check_id_token(token, found, "other-app", "another-sign-in")
    with pytest.raises(OidcError, match="expired"):
        check_id_token(token, found, "other-app", begun.nonce, now=claims["exp"] + LEEWAY_S + 1)
    head, body, sig = token.split(".")
    touched = f"{head}.{body[:-2]}{'A' if body[-2] != 'A' else 'B'}{body[-1]}.{sig}"
    with pytest.raises(OidcError, match="signature"):
        check_id_token(touched, found, "other-app", begun.nonce)
    with pytest.raises(OidcError, match="refused the code"):  # a code is good once
        await found.redeem(settings, parse_qs(urlsplit(back).query)["code"][0], begun, "http://127.0.0.1/back")


async def test_settings_are_shown_without_secrets_and_kept_secrets_stay(served, nc, provider):
    shown = await call(nc, people.SIGNIN_SHOW, Empty())
    assert shown.oidc.client_secret == "" and shown.secrets_kept == ["oidc.client_secret"]
    # a change that leaves the secret empty keeps the one kept
    changed = SignInSettings(oidc=_with(shown.oidc, label="Company SSO"), by="t")
    await call(nc, people.SIGNIN_PUT, changed)
    assert served.router.accounts.people.signin.oidc.client_secret == CLIENT_SECRET
    assert (await call(nc, people.SIGNIN_SHOW, Empty())).oidc.label == "Company SSO"
    # a file named from afar would be read and sent to whatever provider came with it
    with pytest.raises(BadRequest, match="not as a file: files are named in the router's config"):
        await call(nc, people.SIGNIN_PUT, SignInSettings(oidc=_with(shown.oidc, client_secret_file="/etc/shadow")))


def _with(s: OidcSettings, **changes) -> OidcSettings:
    return msgspec.structs.replace(s, **changes)
