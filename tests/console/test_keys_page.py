"""The keys and projects page with JavaScript off, against a real router: a key made on the page
is shown once (never again, never in a redirect or a cookie) and works at once; revoking it stops
it; limits are saved and shown with what is used against them; bad input changes nothing and
says what was wrong; every value shown is escaped."""

import re
import time

import httpx
import msgspec

from llmgw.proto import Empty, KeyRecord
from llmgw.router.accounts.keys import key_hash


async def _keys(stack) -> dict[str, KeyRecord]:
    return (await stack.router.accounts.list_keys(Empty())).keys


async def _models(stack, key: str) -> int:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return (await http.get("/v1/models", headers={"authorization": f"Bearer {key}"})).status_code


def _row(html: str, row_id: str) -> str:
    start = html.index(f'id="{row_id}"')
    return html[start : html.index("</tr>", start)]


async def test_a_key_made_on_the_page_is_shown_once_works_and_stops_when_revoked(stack):
    browser = await stack.signed_in()
    await browser.page("/console/keys")
    made = await browser.post("/console/keys", {"key_name": "ci-bot", "key_project": "team-a", "key_models": ""})
    assert made.status_code == 201 and "Copy it now: it is not shown again." in made.text
    key = re.search(r'<code id="new-key">(sk-llmgw-[^<]+)</code>', made.text).group(1)
    assert key not in made.headers.get("set-cookie", "") and not made.history  # answered, not redirected
    [kid] = [i for i, k in (await _keys(stack)).items() if k.name == "ci-bot"]
    assert kid == key_hash(key)[:16] and (await _keys(stack))[kid].project == "team-a"
    again = await browser.page("/console/keys")
    assert key not in again.text and "new-key" not in again.text and kid in again.text
    assert 'data-confirm="Revoke the key &#39;ci-bot&#39;' in again.text
    assert await _models(stack, key) == 200

    revoked = await browser.post("/console/keys/revoke", {"id": kid})
    assert revoked.url.path == "/console/keys" and revoked.history[0].status_code == 303
    assert f"The key &#39;ci-bot&#39; ({kid}) is revoked" in revoked.text
    assert kid not in await _keys(stack) and await _models(stack, key) == 401
    twice = await browser.post("/console/keys/revoke", {"id": kid})
    assert twice.status_code == 404 and f"No key has the id &#39;{kid}&#39;" in twice.text


async def test_limits_are_saved_and_shown_with_what_is_used_against_them(stack):
    browser = await stack.signed_in()
    await browser.page("/console/keys")
    form = {"key_name": "metered", "key_project": "team-b", "key_admin": "1", "key_expires_days": "30"}
    form |= {"limit.requests_per_minute": "5", "limit.tokens_per_day": "1000", "key_models": "tiny, other"}
    made = await browser.post("/console/keys", form)
    assert made.status_code == 201, made.text
    [(kid, record)] = [(i, k) for i, k in (await _keys(stack)).items() if k.name == "metered"]
    assert record.admin and record.models == ["tiny", "other"] and record.expires is not None
    limits = record.limits
    assert (limits.requests_per_minute, limits.tokens_per_day, limits.concurrent) == (5, 1000, None)
    accounts = stack.router.accounts
    assert (await accounts.admit(accounts.scopes(kid, record), time.time(), reserve=40)).ok  # one in flight
    row = _row((await browser.page("/console/keys")).text, f"key-{kid}")
    assert "Requests a minute: 1 of 5" in row and "Tokens a day (UTC): 0 of 1,000" in row
    assert "team-b" in row and "admin" in row and "tiny, other" in row

    saved = await browser.post("/console/projects", {"project_name": "team-b", "limit.tokens_per_month": "200000"})
    assert saved.url.path == "/console/keys" and saved.history[0].status_code == 303
    assert "The limits of project &#39;team-b&#39; are saved" in saved.text
    assert "Tokens a month (UTC): 0 of 200,000" in _row(saved.text, "project-team-b")
    assert accounts.projects.items["team-b"].limits.tokens_per_month == 200_000
    filled = await browser.page("/console/keys?project=team-b")  # the form filled in with the limits as they are
    assert 'id="project_name" name="project_name" type="text" required value="team-b"' in filled.text
    assert 'name="limit.tokens_per_month" type="number" min="1" value="200000"' in filled.text


async def test_bad_input_is_refused_on_the_page_with_the_values_kept_and_nothing_changed(stack):
    browser = await stack.signed_in()
    await browser.page("/console/keys")
    before, projects = await _keys(stack), dict(stack.router.accounts.projects.items)
    cases = [
        ({"key_name": "<b>x</b>"}, "Name: &#39;&lt;b&gt;x&lt;/b&gt;&#39; is not a name here"),
        ({"key_name": ""}, "Name: &#39;&#39; is not a name here"),
        ({"key_name": "ok", "key_project": "a.b"}, "Project: &#39;a.b&#39; is not a name here"),
        ({"key_name": "ok", "key_models": "tiny <i>"}, "Models: &#39;&lt;i&gt;&#39; is not a name here"),
        ({"key_name": "ok", "limit.requests_per_minute": "0"}, "Requests a minute: &#39;0&#39; is not allowed"),
        ({"key_name": "ok", "limit.concurrent": "two"}, "Requests at once: &#39;two&#39; is not allowed"),
        ({"key_name": "ok", "limit.tokens_per_day": "-5"}, "Tokens a day (UTC): &#39;-5&#39; is not allowed"),
        ({"key_name": "ok", "key_expires_days": "0"}, "Expires after (days): &#39;0&#39; is not allowed"),
    ]
    for form, said in cases:
        page = await browser.post("/console/keys", form)
        assert page.status_code == 400 and said in page.text and "Nothing was changed" in page.text, form
        assert "new-key" not in page.text and "<b>x</b>" not in page.text and "<i>" not in page.text
    kept = await browser.post("/console/keys", {"key_name": "kept-name", "limit.concurrent": "x", "key_admin": "1"})
    assert 'value="kept-name"' in kept.text and 'name="key_admin" value="1" checked' in kept.text
    for ref in ("0123456789abcdef", "<script>"):
        page = await browser.post("/console/keys/revoke", {"id": ref})
        assert page.status_code == 404 and "No key has the id" in page.text and "<script>" not in page.text
    for form in ({"project_name": "bad name"}, {"project_name": "default", "limit.concurrent": "0"}):
        page = await browser.post("/console/projects", form)
        assert page.status_code == 400 and "Nothing was changed" in page.text, form
    assert await _keys(stack) == before and stack.router.accounts.projects.items == projects


async def test_what_the_keys_bucket_holds_is_shown_as_text(stack):
    accounts = stack.router.accounts
    record = KeyRecord(name="<script>alert(1)</script>", created=time.time(), project="<b>p</b>", models=["<i>m</i>"])
    digest = key_hash("sk-llmgw-marked")
    await accounts.keys.kv.put(digest, msgspec.json.encode(record))
    accounts.keys.items[digest] = record
    browser = await stack.signed_in()
    page = await browser.page("/console/keys")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "&lt;b&gt;p&lt;/b&gt;" in page.text
    assert "<script>alert" not in page.text and "<b>p</b>" not in page.text and "<i>m</i>" not in page.text


async def test_revoking_the_key_signed_in_with_warns_first_and_ends_the_session(stack):
    browser = await stack.signed_in()
    [ops] = [i for i, k in (await _keys(stack)).items() if k.name == "ops"]
    page = await browser.page("/console/keys")
    assert "It is the key you signed in with" in _row(page.text, f"key-{ops}")
    assert "It is the key you signed in with" not in page.text.replace(_row(page.text, f"key-{ops}"), "")
    out = await browser.post("/console/keys/revoke", {"id": ops})
    assert out.url.path == "/console/signin" and "was revoked" in out.text and ops not in await _keys(stack)
