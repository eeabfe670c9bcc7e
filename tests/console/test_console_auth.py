"""Signing in to the console, sessions and CSRF, with JavaScript off (a plain HTTP client posting
the forms) against a real router over a real nats-server: only admin keys get in, the session
cookie is HttpOnly and SameSite=Strict, a form without this session's token changes nothing, an
ended or revoked session sends back to sign in, and the pages speak English or Turkish."""

import re
import time
from types import SimpleNamespace

from llmgw.proto import Empty, KeyRef
from llmgw.router.console import web


async def test_pages_need_a_session_and_say_so(stack):
    browser = stack.browser()
    page = await browser.get("/console/models")
    assert page.url.path == "/console/signin" and page.status_code == 200
    assert "Sign in to use the console." in page.text


async def test_an_admin_key_signs_in_with_a_strict_httponly_cookie_that_does_not_hold_the_key(stack):
    browser = stack.browser()
    await browser.get("/console/signin")
    token = re.search(r'name="csrf" value="([^"]*)"', (await browser.get("/console/signin")).text).group(1)
    form = {"csrf": token, "key": stack.admin_key}
    raw = await browser.http.post("/console/signin", data=form, follow_redirects=False)
    assert (
        raw.status_code == 303 and raw.headers["location"] == "/console/dashboard"
    )  # an admin lands on the fleet at a glance
    cookie = next(c for c in raw.headers.get_list("set-cookie") if c.startswith("llmgw_console="))
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Max-Age=" in cookie
    assert stack.admin_key not in cookie
    models = await browser.get("/console/models")
    assert models.status_code == 200 and "Signed in as ops." in models.text


async def test_a_users_key_and_a_wrong_key_are_refused_with_what_to_do(stack):
    browser = stack.browser()
    refused = await browser.sign_in(stack.user_key)
    assert refused.status_code == 403 and "sign in with an admin key" in refused.text
    wrong = await browser.sign_in("sk-not-a-key")
    assert wrong.status_code == 401 and "llmgw ctl key create --admin" in wrong.text
    assert (await browser.get("/console/models")).url.path == "/console/signin"


async def test_a_sign_in_posted_without_the_pages_token_is_refused(stack):
    browser = stack.browser()
    response = await browser.http.post("/console/signin", data={"key": stack.admin_key, "csrf": "forged"})
    assert response.status_code == 403 and "try again" in response.text
    assert "llmgw_console=" not in response.headers.get("set-cookie", "")


async def test_a_form_with_a_forged_or_missing_csrf_token_changes_nothing(stack):
    browser = await stack.signed_in()
    for token in ("forged", ""):
        response = await browser.post("/console/signout", csrf=token)
        assert response.status_code == 403 and "Nothing was changed" in response.text
    assert (await browser.get("/console/models")).status_code == 200  # still signed in


async def test_a_revoked_key_ends_its_sessions_at_once(stack):
    browser = await stack.signed_in()
    [key_id] = [i for i, k in (await stack.router.accounts.list_keys(Empty())).keys.items() if k.name == "ops"]
    await stack.router.accounts.revoke_key(KeyRef(id=key_id))
    page = await browser.get("/console/models")
    assert page.url.path == "/console/signin" and "was revoked" in page.text
    posted = await browser.post("/console/signout")
    assert posted.status_code == 401 and "Nothing was changed" in posted.text


async def test_an_ended_session_sends_back_to_sign_in_and_a_form_posted_with_it_changes_nothing(stack, monkeypatch):
    browser = await stack.signed_in()
    later = time.time() + stack.router.config.console_session_s + 60
    # the router's clock moves on (the browser's cookie jar keeps the cookie, as one whose own
    # clock is behind would)
    monkeypatch.setattr(web, "time", SimpleNamespace(time=lambda: later))
    page = await browser.get("/console/models")
    assert page.url.path == "/console/signin" and "Your session has ended" in page.text
    posted = await browser.post("/console/signout")
    assert posted.status_code == 401 and "Your session has ended" in posted.text


async def test_signing_out_ends_the_session(stack):
    browser = await stack.signed_in()
    out = await browser.post("/console/signout")
    assert out.url.path == "/console/signin" and "You are signed out." in out.text
    assert (await browser.get("/console/models")).url.path == "/console/signin"


async def test_the_language_is_the_browsers_and_the_switch_keeps_it(stack):
    browser = stack.browser()
    turkish = await browser.http.get("/console/signin", headers={"accept-language": "tr-TR,tr;q=0.9,en;q=0.5"})
    assert '<html lang="tr">' in turkish.text and "Oturum aç" in turkish.text
    switched = await browser.get("/console/lang?to=tr&next=/console/signin")
    assert switched.url.path == "/console/signin" and "Yönetici anahtarı" in switched.text
    back = await browser.get("/console/lang?to=en&next=https://evil.example/")
    assert back.url.host == "127.0.0.1"  # never sent to another site


async def test_an_address_that_is_no_console_page_says_so_on_a_page(stack):
    browser = await stack.signed_in()
    page = await browser.get("/console/no/such/<b>page</b>")
    assert page.status_code == 404
    assert "There is no console page at /console/no/such/&lt;b&gt;page&lt;/b&gt;." in page.text


async def test_a_page_drawn_after_a_refused_form_follows_the_page_the_form_was_on_and_no_other_site(stack):
    browser = await stack.signed_in()
    assert 'data-refresh="/console/models"' in (await browser.get("/console/models")).text
    here = f"{stack.url}/console/mirror?x=1"
    refused = await browser.http.post("/console/signout", data={"csrf": "forged"}, headers={"referer": here})
    assert refused.status_code == 403 and 'data-refresh="/console/mirror?x=1"' in refused.text
    elsewhere = await browser.http.post(
        "/console/signout", data={"csrf": "forged"}, headers={"referer": "https://evil.example/console/models"}
    )
    assert elsewhere.status_code == 403 and "data-refresh" not in elsewhere.text


async def test_a_token_or_cookie_outside_ascii_is_refused_as_any_wrong_one_not_a_failure(stack):
    browser = await stack.signed_in()
    forged = await browser.post("/console/signout", csrf="é")
    assert forged.status_code == 403 and "Nothing was changed" in forged.text
    stranger = stack.browser()
    cookie = "llmgw_console=v1.0123456789abcdef.9999999999.00.\u00e9".encode("latin-1")
    page = await stranger.http.get("/console/models", headers={"cookie": cookie})
    assert page.url.path == "/console/signin" and "not one this console signed" in page.text
    pre = (await stranger.get("/console/signin")).text
    assert pre and (await stranger.http.post("/console/signin", data={"csrf": "ü", "key": "x"})).status_code == 403


async def test_a_form_posted_after_the_session_ended_offers_a_sign_in_that_works_and_comes_back(stack):
    browser = stack.browser()
    refused = await browser.http.post(
        "/console/signout", data={"csrf": "x"}, headers={"referer": f"{stack.url}/console/keys?project=p"}
    )
    assert refused.status_code == 401 and "Sign in to use the console." in refused.text
    token = re.search(r'name="csrf" value="([^"]*)"', refused.text).group(1)
    back = re.search(r'name="next" value="([^"]*)"', refused.text).group(1)
    assert back == "/console/keys?project=p"
    signed = await browser.http.post("/console/signin", data={"csrf": token, "key": stack.admin_key, "next": back})
    assert signed.status_code == 200 and signed.url.path == "/console/keys", signed.text[:300]


async def test_switching_language_comes_back_to_the_same_page_with_its_query(stack):
    browser = await stack.signed_in()
    page = await browser.get("/console/usage?since=week&group_by=key")
    switch = re.search(r'href="(/console/lang\?to=tr[^"]*)"', page.text).group(1).replace("&amp;", "&")
    turkish = await browser.get(switch)
    assert str(turkish.url).endswith("/console/usage?since=week&group_by=key") and '<html lang="tr">' in turkish.text


async def test_pages_forbid_framing_sniffing_and_anything_not_from_the_router(stack):
    browser = await stack.signed_in()
    headers = (await browser.get("/console/models")).headers
    assert headers["x-content-type-options"] == "nosniff"
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]


async def test_a_number_written_with_other_digits_is_refused_naming_the_field(stack):
    browser = await stack.signed_in()
    await browser.page("/console/keys")
    refused = await browser.post("/console/keys", {"key_name": "sup", "key_expires_days": "²"})
    assert refused.status_code == 400 and "&#39;²&#39; is not allowed" in refused.text
    assert "sup" not in [k.name for k in (await stack.router.accounts.list_keys(Empty())).keys.values()]
