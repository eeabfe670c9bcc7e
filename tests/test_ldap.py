"""Signing in with a real LDAP directory (Debian's slapd, started here with a small directory):
the user found by a search as the service account, its password checked by binding as it, its
groups mapped to roles per tenant; a wrong password, an unknown name, a disabled account, an
empty password and an injection in the name all refused; the settings tried before they are
kept; a directory user signing in to the console through the real router."""

from __future__ import annotations

import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import BUCKETS, Empty, people
from llmgw.proto.people import GroupRole, LdapSettings, Tenant
from llmgw.router.accounts.ldap import DirectoryError, find_user, try_settings
from llmgw.router.accounts.people import SignInRefused
from tests.certs import certificates
from tests.console.conftest import Browserless, csrf_of
from tests.fleets import serve_router
from tests.slapd import BASE, Slapd, group, user


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    entries = [
        user("svc", "service-password"),
        user("ada", "ada-password-1"),
        user("bob", "bob-password-1"),
        user("eve", "eve-password-1", "employeeType: disabled\n"),
        user("nogroup", "nogroup-password"),
        group("ml-team", "ada", "bob"),
        group("ml-ops", "ada"),
    ]
    server = Slapd(tmp_path_factory.mktemp("slapd"), entries)
    yield server
    server.stop()


def settings(slapd, tmp_path, **changes) -> LdapSettings:
    secret = tmp_path / "bind-password"
    secret.write_text("service-password\n")
    secret.chmod(0o600)
    fields = {
        "url": slapd.url,
        "bind_dn": f"uid=svc,ou=people,{BASE}",
        "bind_password_file": str(secret),
        "user_base": f"ou=people,{BASE}",
        "user_filter": "(&(uid={name})(!(employeeType=disabled)))",
        "group_base": f"ou=groups,{BASE}",
        "groups": [
            GroupRole(group=f"cn=ml-team,ou=groups,{BASE}", tenant="research", role="member"),
            GroupRole(group=f"CN=ML-OPS,ou=groups,{BASE}", tenant="research", role="operator"),
        ],
        **changes,
    }
    return LdapSettings(**fields)


def test_a_user_binds_and_its_groups_map_to_the_highest_role_per_tenant(slapd, tmp_path):
    s = settings(slapd, tmp_path)
    ada = find_user(s, "ada", "ada-password-1")
    assert ada is not None and ada.dn == f"uid=ada,ou=people,{BASE}" and ada.roles == {"research": "operator"}
    assert find_user(s, "bob", "bob-password-1").roles == {"research": "member"}
    assert find_user(s, "nogroup", "nogroup-password").roles == {}


@pytest.mark.parametrize(
    ("name", "password"),
    [
        pytest.param("ada", "wrong-password", id="a wrong password"),
        pytest.param("nobody", "whatever-it-is", id="a name the directory does not have"),
        pytest.param("eve", "eve-password-1", id="a disabled account (left out by the filter)"),
        pytest.param("ada", "", id="an empty password (an anonymous bind would succeed)"),
        pytest.param("*", "ada-password-1", id="a wildcard for a name"),
        pytest.param("ada)(uid=*", "ada-password-1", id="a filter injected through the name"),
        pytest.param("*)(|(uid=*", "bob-password-1", id="an injection that would match every user"),
    ],
)
def test_what_does_not_sign_in_is_refused_the_same_way(slapd, tmp_path, name, password):
    assert find_user(settings(slapd, tmp_path), name, password) is None


def test_settings_are_tried_before_they_are_kept_and_a_wrong_one_says_why(slapd, tmp_path):
    s = settings(slapd, tmp_path)
    said = try_settings(s, "ada")
    assert said.startswith(f"bind as uid=svc,ou=people,{BASE} worked; ada is uid=ada,ou=people,{BASE}, in 2 groups")
    assert said.endswith("operator of research")
    assert try_settings(s).startswith(f"bind as uid=svc,ou=people,{BASE} worked;")
    (tmp_path / "bind-password").write_text("not-it\n")
    with pytest.raises(DirectoryError, match=f"binding as uid=svc,ou=people,{BASE} was refused"):
        try_settings(s)
    with pytest.raises(DirectoryError, match="ldap://127.0.0.1:1"):
        find_user(settings(slapd, tmp_path, url="ldap://127.0.0.1:1", timeout_s=2.0), "ada", "ada-password-1")


async def test_an_admin_sets_the_directory_up_on_the_console_and_its_user_signs_in(slapd, serve, nc, tmp_path, capfd):
    served = await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"))
    await call(nc, people.TENANT_PUT, Tenant(name="research", by="t"))
    admin = Browserless(served.router.http.url)
    await admin.sign_in(served.admin_key)
    form = {
        "url": slapd.url,
        "bind_dn": f"uid=svc,ou=people,{BASE}",
        "bind_password": "not-the-password",
        "user_base": f"ou=people,{BASE}",
        "user_filter": "(&(uid={name})(!(employeeType=disabled)))",
        "group_base": f"ou=groups,{BASE}",
        "groups": f"cn=ml-team,ou=groups,{BASE}=research:member\nCN=ML-OPS,ou=groups,{BASE}=research:operator",
        "try_name": "ada",
    }
    await admin.page("/console/identity")
    wrong = await admin.post("/console/identity/ldap", {**form, "do": "keep"})
    assert wrong.status_code == 400 and "not kept: directory: failed: binding as uid=svc" in wrong.text
    assert (await call(nc, people.SIGNIN_SHOW, Empty())).ldap is None
    bad_map = await admin.post("/console/identity/ldap", {**form, "groups": "ml-team", "do": "try"})
    assert bad_map.status_code == 400 and "is not GROUP=TENANT:ROLE" in bad_map.text
    form["bind_password"] = "service-password"
    tried = await admin.post("/console/identity/ldap", {**form, "do": "try"})
    assert tried.status_code == 200 and "in 2 groups: operator of research" in tried.text
    kept = await admin.post("/console/identity/ldap", {**form, "do": "keep"})
    assert kept.status_code == 200 and "Kept: directory: bind as" in kept.text
    assert "service-password" not in kept.text and "A secret is kept" in kept.text
    stored = (await (await nc.jetstream().key_value(BUCKETS["settings"])).get("signin")).value
    assert b"service-password" not in stored and b"sealed.v1." in stored
    # the password left empty on a change keeps the kept one
    again = await admin.post("/console/identity/ldap", {**form, "bind_password": "", "do": "keep"})
    assert again.status_code == 200 and "Kept: directory: bind as" in again.text

    directory = served.router.accounts.people
    with pytest.raises(SignInRefused, match="no group mapped to a tenant"):
        await directory.sign_in("nogroup", "nogroup-password", 0.0)
    browser = Browserless(served.router.http.url)
    page = await browser.get("/console/signin")
    signin = {"csrf": csrf_of(page.text), "name": "ada", "password": "ada-password-1", "next": ""}
    landed = await browser.http.post("/console/signin", data=signin)
    assert landed.status_code == 200 and "Signed in as ada." in landed.text and "Fleet" in landed.text
    recorded = directory.user("ada")
    assert (recorded.source, recorded.roles, recorded.password) == ("ldap", {"research": "operator"}, "")
    wrong = {**signin, "csrf": csrf_of((await browser.get("/console/signin")).text), "password": "nope"}
    refused = await Browserless(served.router.http.url).http.post("/console/signin", data=wrong)
    assert refused.status_code in (401, 403)
    assert (await browser.get("/console/identity")).status_code == 403  # an operator does not set sign-in up
    # no password in a log line, the audit trail or a KV value
    out, err = capfd.readouterr()
    trail = str(await call(nc, people.AUDIT_LOG, people.AuditQuery(limit=500)))
    users = (await (await nc.jetstream().key_value(BUCKETS["users"])).get("ada")).value.decode()
    for secret in ("service-password", "ada-password-1", "not-the-password"):
        assert secret not in out + err and secret not in trail and secret not in users


def test_the_router_config_takes_an_ldap_table(tmp_path):
    from llmgw.bus import load_config
    from llmgw.router.config import RouterConfig

    path = tmp_path / "router.toml"
    path.write_text(
        '[ldap]\nurl = "ldap://dc.example.com:389"\nstarttls = true\nuser_base = "OU=People,DC=example,DC=com"\n'
        'groups = [{group = "CN=ML,OU=Groups,DC=example,DC=com", tenant = "research", role = "member"}]\n'
    )
    got = load_config(RouterConfig, ["--config", str(path)], env={}).ldap
    assert got is not None and got.starttls and got.groups[0].tenant == "research"


@pytest.fixture(scope="module")
def slapd_tls(tmp_path_factory):
    home = tmp_path_factory.mktemp("slapd-tls")
    server = Slapd(home, [user("svc", "service-password"), user("ada", "ada-password-1")], certificates(home / "tls"))
    yield server
    server.stop()


def test_starttls_checks_the_directorys_certificate_against_the_ca_given(slapd_tls, tmp_path):
    ca = str(slapd_tls.home / "tls" / "ca.pem")
    s = settings(slapd_tls, tmp_path, starttls=True, ca_file=ca, groups=[])
    assert find_user(s, "ada", "ada-password-1").dn == f"uid=ada,ou=people,{BASE}"
    assert try_settings(s).startswith(f"bind as uid=svc,ou=people,{BASE} worked;")
    untrusted = settings(slapd_tls, tmp_path, starttls=True, groups=[])  # the system's CAs never signed it
    with pytest.raises(DirectoryError, match="certificate|TLS|tls|ssl|SSL"):
        find_user(untrusted, "ada", "ada-password-1")
