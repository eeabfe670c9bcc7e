"""The guardrails page against the real router: an admin sees each policy and the latest checks
(a request a pattern blocked, what was found, how long it took); an operator of another tenant
sees neither; a member does not open the page."""

from __future__ import annotations

import httpx

from llmgw.bus import call
from llmgw.proto import KeyCreate, Model, ModelPut, catalog, guard
from llmgw.proto.guard import Check, Policy
from tests.fleets import SOURCE


async def test_the_page_shows_policies_and_the_latest_checks_to_whom_they_belong(stack):
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="t"))
    codename = Check(kind="pattern", action="block", pattern="(?i)falcon", label="CODENAME")
    await call(stack.nc, guard.GUARD_PUT, Policy(name="codes", input=[Check(kind="pii"), codename], by="t"))
    key = await stack.router.accounts.create_key(KeyCreate(name="k"))
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(50):  # the router's copy of the catalog follows a KV watch
            refused = await http.post(
                f"{stack.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {key.key}"},
                json={"model": "tiny", "messages": [{"role": "user", "content": "mail ada@example.com about Falcon"}]},
            )
            if refused.status_code != 404:
                break
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "guardrail_blocked"
    admin = await stack.signed_in()
    page = await admin.page("/console/guard")
    assert page.status_code == 200 and 'data-policy="codes"' in page.text
    assert "EMAIL (redact), CODENAME (block)" in page.text and "<strong>blocked</strong>" in page.text
    assert "Falcon" not in page.text and "ada@example.com" not in page.text  # never what was found

    olga = await stack.user_signed_in("olga", "lab", "operator")
    theirs = await olga.get("/console/guard")
    assert theirs.status_code == 200 and 'data-policy="codes"' not in theirs.text
    assert "<strong>blocked</strong>" not in theirs.text
