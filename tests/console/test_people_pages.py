"""The console for people with JavaScript off, against the real router and catalog: users sign
in with a name and password, each role sees its own pages and nothing else (a member its own
keys), a lock after wrong passwords is said as such, a role changed counts from the next
request, a user removed is signed out at once."""

from __future__ import annotations

import re

from llmgw.bus import call
from llmgw.proto import people
from llmgw.proto.people import Tenant, UserCreate, UserRef, UserRole
from tests.console.conftest import Browserless, csrf_of

PASSWORD = "correct horse battery staple"


async def _user(stack, name: str, role: str = "member") -> None:
    await call(stack.nc, people.TENANT_PUT, Tenant(name="research", by="t"))
    ask = UserCreate(name=name, tenant="research", role=role, password=PASSWORD, by="t")
    await call(stack.nc, people.USER_CREATE, ask)


async def _sign_in(stack, name: str, password: str = PASSWORD):
    browser = Browserless(stack.url)
    page = await browser.get("/console/signin")
    form = {"csrf": csrf_of(page.text), "name": name, "password": password, "next": ""}
    answered = await browser.http.post("/console/signin", data=form)
    if 'name="csrf"' in answered.text and answered.status_code == 200:
        browser._csrf = csrf_of(answered.text)
    return browser, answered


async def test_a_member_signs_in_and_sees_only_its_own_pages_and_keys(stack):
    await _user(stack, "mia")
    browser, landed = await _sign_in(stack, "mia")
    assert landed.status_code == 200 and str(landed.url).endswith("/console/playground"), landed.url
    nav = landed.text[landed.text.index("<nav") : landed.text.index("</nav>")]
    assert [p in nav for p in ("Playground", "Keys", "Usage", "Requests")] == [True] * 4
    assert "Models" not in nav and "Fleet" not in nav and "Mirror" not in nav and "Dashboard" not in nav
    refused = await browser.get("/console/models")
    assert refused.status_code == 403 and "mia is a member, whose console does not open this page" in refused.text
    page = await browser.page("/console/keys")
    assert "ops" not in page.text and 'name="key_admin"' not in page.text and 'id="projects"' not in page.text
    made = await browser.post("/console/keys", {"key_name": "mias-key", "key_admin": "1"})
    assert made.status_code == 201 and "sk-llmgw-" in made.text
    mine = [k for k in stack.router.accounts.keys.items.values() if k.name == "mias-key"]
    assert [(k.owner, k.tenant, k.admin) for k in mine] == [("mia", "research", False)]
    ops = next(kid for kid, k in (await stack.router.accounts.list_keys()).keys.items() if k.name == "ops")
    gone = await browser.post("/console/keys/revoke", {"id": ops})
    assert gone.status_code == 404 and any(k.name == "ops" for k in stack.router.accounts.keys.items.values())
    assert (await browser.post("/console/projects", {"project_name": "x"})).status_code == 403


async def test_wrong_passwords_lock_the_name_and_the_words_never_say_which_was_wrong(stack):
    await _user(stack, "lee")
    for _ in range(5):
        _, refused = await _sign_in(stack, "lee", "not the password!")
        assert refused.status_code == 401 and "That name and password do not sign in" in refused.text
    _, nobody = await _sign_in(stack, "nobody-here", "not the password!")
    assert nobody.status_code == 401 and "That name and password do not sign in" in nobody.text
    _, locked = await _sign_in(stack, "lee")
    waits = re.search(r"Too many wrong passwords for lee in a row: try again in (\d+) seconds", locked.text)
    assert locked.status_code == 429 and waits and 20 <= int(waits.group(1)) <= 30  # rounded up; this machine is slow


async def test_a_role_changed_counts_from_the_next_request_and_a_user_removed_is_signed_out(stack):
    await _user(stack, "otto")
    browser, _ = await _sign_in(stack, "otto")
    assert (await browser.get("/console/models")).status_code == 403
    await call(stack.nc, people.USER_ROLE, UserRole(name="otto", tenant="research", role="operator", by="t"))
    models = await browser.get("/console/models")
    assert models.status_code == 200 and "Fleet" in models.text and "Dashboard" in models.text
    await call(stack.nc, people.USER_REMOVE, UserRef(name="otto", by="t"))
    after = await browser.get("/console/models")
    assert str(after.url).startswith(f"{stack.url}/console/signin") and "why=revoked" in str(after.url)


async def test_an_admin_makes_users_and_tenants_on_the_people_page_and_the_audit_page_says_who(stack):
    import re

    admin = await stack.signed_in()
    await admin.page("/console/people")
    tenant = await admin.post("/console/people/tenants", {"tenant_name": "lab", "models": "tiny, other"})
    assert tenant.status_code == 200 and "Tenant lab saved." in tenant.text
    made = await admin.post("/console/people/users", {"name": "zed", "tenant": "lab", "role": "member"})
    assert made.status_code == 201 and 'id="made-password"' in made.text
    password = re.search(r'<code id="made-password">([^<]+)</code>', made.text).group(1)
    admin._csrf = csrf_of(made.text)
    _, zed = await _sign_in(stack, "zed", password)
    assert zed.status_code == 200 and "Signed in as zed." in zed.text
    role = await admin.post("/console/people/role", {"name": "zed", "tenant": "lab", "role": "operator"})
    assert "zed: operator in lab, from its next request." in role.text
    bad = await admin.post("/console/people/users", {"name": "not a name!", "tenant": "lab", "role": "member"})
    assert bad.status_code == 400 and "That form is not one the router takes" in bad.text
    admin._csrf = csrf_of(bad.text)
    gone = await admin.post("/console/people/remove", {"name": "zed"})
    assert "zed was removed" in gone.text and stack.router.accounts.people.user("zed") is None
    trail = await admin.page("/console/audit?area=users")
    assert trail.status_code == 200 and trail.text.count("<td>ops</td>") >= 3 and password not in trail.text
    lab = await admin.page("/console/audit?tenant=lab")
    rows = lab.text[lab.text.index('<table id="audit"') :]
    assert '<option value="lab" selected>' in lab.text and rows.count("<td>lab</td>") >= 3
    assert "<td>research</td>" not in rows
    await _user(stack, "mem")
    member, _ = await _sign_in(stack, "mem")
    assert (await member.get("/console/people")).status_code == 403
    assert (await member.get("/console/audit")).status_code == 403


async def test_an_operator_runs_only_the_models_its_tenants_may_use(stack):
    from llmgw.proto import Model, ModelPut, catalog
    from tests.fleets import SOURCE

    for name in ("tiny", "other"):
        await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name=name, source=SOURCE), by="t"))
    await call(stack.nc, people.TENANT_PUT, Tenant(name="lab", models=["tiny"], by="t"))
    await call(stack.nc, people.USER_CREATE, UserCreate(name="opa", tenant="lab", role="operator", password=PASSWORD))
    browser, _ = await _sign_in(stack, "opa")
    listed = await browser.get("/console/models")
    assert listed.status_code == 200 and 'href="/console/models/tiny"' in listed.text
    assert 'href="/console/models/other"' not in listed.text
    assert (await browser.get("/console/models/tiny")).status_code == 200
    refused = await browser.get("/console/models/other")
    assert refused.status_code == 403 and "opa operates tenants that may not use this model" in refused.text
    page = await browser.page("/console/models/tiny")  # its forms' token, then a change to the other
    stopped = await browser.post("/console/models/other/stop", {"revision": "1"})
    assert stopped.status_code == 403 and page.status_code == 200
    assert (await call(stack.nc, catalog.MODEL_GET, catalog.ModelRef(name="other"))).revision == 2  # unchanged


async def test_signing_in_always_gives_a_fresh_session_whatever_the_browser_held(stack):
    """Session fixation: a cookie planted before signing in (forged, or another's) is replaced."""
    await _user(stack, "fay")
    browser = Browserless(stack.url)
    planted = "v1.u-fay.9999999999.0000000000000000.forged"
    browser.http.cookies.set("llmgw_console", planted, path="/console")
    page = await browser.get("/console/signin")
    form = {"csrf": csrf_of(page.text), "name": "fay", "password": PASSWORD, "next": ""}
    signed = await browser.http.post("/console/signin", data=form, follow_redirects=False)
    issued = [c for c in signed.headers.get_list("set-cookie") if c.startswith("llmgw_console=")]
    assert len(issued) == 1 and planted not in issued[0] and "HttpOnly" in issued[0], issued
    other, _ = await _sign_in(stack, "fay")
    first = other.http.cookies.get("llmgw_console")
    again, _ = await _sign_in(stack, "fay")
    assert first and again.http.cookies.get("llmgw_console") != first  # each sign-in its own session


async def test_the_audit_page_draws_every_area_the_trail_holds(stack):
    from llmgw.proto import guard, hooks
    from llmgw.proto.guard import Check, Policy
    from llmgw.proto.hooks import Hook
    from llmgw.proto.people import AUDIT_AREAS

    await call(stack.nc, guard.GUARD_PUT, Policy(name="pii", input=[Check(kind="pii")], by="t"))
    await call(stack.nc, hooks.HOOK_PUT, Hook(name="ops", url="https://hooks.example.com/x", by="t"))
    admin = await stack.signed_in()
    for _ in range(50):
        page = await admin.page("/console/audit")
        if "guardrails" in page.text and "webhooks" in page.text:
            break
    assert page.status_code == 200 and "guardrails" in page.text and "webhooks" in page.text
    for area in AUDIT_AREAS:  # each is offered in the filter, in words
        assert f'<option value="{area}"' in page.text
