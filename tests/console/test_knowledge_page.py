"""The knowledge page against the real router: an admin sees a base and its tree, sends a
document by the form (refused with the service's words where it cannot be read), sees it
queued saying what it waits for (its embedding model has no replica), and forgets it; a member
of another tenant is told the base is not there."""

from __future__ import annotations

import asyncio

from llmgw.bus import call
from llmgw.proto import Model, ModelPut, catalog, knowledge, people
from llmgw.proto.knowledge import KnowledgeBase
from llmgw.proto.people import Tenant
from tests.console.conftest import csrf_of
from tests.fleets import SOURCE


async def test_a_base_is_seen_sent_to_and_forgotten_in_the_console(stack):
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="emb", source=SOURCE, kind="embedding"), by="t"))
    await call(stack.nc, people.TENANT_PUT, Tenant(name="lab", by="t"))
    for _ in range(100):  # the router's directory follows the catalog
        if stack.router.directory.model("emb") is not None:
            break
        await asyncio.sleep(0.05)
    await call(stack.nc, knowledge.KB_PUT, KnowledgeBase(name="handbook", tenant="lab", embedding="emb", by="t"))
    admin = await stack.signed_in()
    listed = await admin.page("/console/knowledge")
    assert listed.status_code == 200 and 'data-base="lab/handbook"' in listed.text
    tree = await admin.page("/console/knowledge/lab/handbook")
    assert tree.status_code == 200 and 'enctype="multipart/form-data"' in tree.text
    upload = "/console/knowledge/lab/handbook/upload"
    form = {"csrf": admin.csrf, "folder": "office"}
    sent = await admin.http.post(upload, data=form, files={"file": ("wifi.md", b"The wifi password is heliotrope.")})
    assert sent.status_code == 200 and "office/wifi.md sent" in sent.text, sent.text
    assert 'data-path="office/wifi.md"' in sent.text
    for _ in range(100):  # the router takes it up at once, finds no replica of emb, and queues it again
        page = await admin.page("/console/knowledge/lab/handbook")
        if 'data-path="office/wifi.md" data-state="queued"' in page.text and "waiting for emb" in page.text:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the document was never shown queued, waiting for its model: {page.text}")
    refused = await admin.http.post(upload, data=form, files={"file": ("deck.pptx", b"PK")})
    assert refused.status_code == 400 and "not &#39;.pptx&#39;" in refused.text
    gone = await admin.http.post(
        "/console/knowledge/lab/handbook/forget", data={"csrf": csrf_of(refused.text), "path": "office/wifi.md"}
    )
    assert gone.status_code == 200 and "1 document(s) forgotten" in gone.text and "data-path=" not in gone.text

    sam = await stack.user_signed_in("sam", "shop", "member")
    theirs = await sam.get("/console/knowledge")
    assert theirs.status_code == 200 and "handbook" not in theirs.text
    other = await sam.get("/console/knowledge/lab/handbook")
    assert other.status_code == 404 and "tenant lab has no knowledge base" in other.text
