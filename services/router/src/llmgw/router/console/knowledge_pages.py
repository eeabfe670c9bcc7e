"""The knowledge page (every signed-in user, for the tenants it has a role in): each knowledge
base and how far its documents are; a base's tree (each document's format, size, state, chunks
and what it waits for), a document sent in (the same operation as the admin API's upload), and
a document or a folder forgotten (the `kb.document.remove` endpoint)."""

from __future__ import annotations

from litestar import get, post
from litestar.datastructures import UploadFile
from litestar.response import Response

from llmgw.proto import knowledge
from llmgw.proto.knowledge import MOST_BYTES, BaseQuery, BaseRef, DocRef
from llmgw.router.console.web import PREFIX, Refused, View
from llmgw.router.errors import ApiError
from llmgw.router.knowledge.store import OPENING, no_base

__all__ = ["ROUTES"]


def _check(view: View, tenant: str, base: str) -> None:
    """404 for a base of a tenant the principal has no role in (the words of one not there)."""
    who = view.principal
    assert who is not None
    try:
        who.check_tenant(tenant, "member", no_base(tenant, base), "Reading a base")
    except ApiError as exc:
        raise Refused(exc.status, exc.message) from None


@get("/knowledge")
async def bases_page(view: View) -> Response:
    """The bases of the principal's tenants, with their documents' states counted."""
    who = view.principal
    assert who is not None
    bases = (await view.ask(knowledge.KB_LIST, BaseQuery())).bases
    bases = [b for b in bases if who.admin or b.tenant in who.roles]
    docs = view.console.gateway.knowledge.docs.items if view.console.gateway.knowledge else {}
    counts: dict[str, dict[str, int]] = {}
    for key, doc in docs.items():
        where = counts.setdefault(".".join(key.split(".")[:2]), {})
        where[doc.state] = where.get(doc.state, 0) + 1
    return view.render("knowledge.html", active="knowledge", bases=bases, counts=counts)


async def _tree(view: View, tenant: str, base: str, status: int = 200, error: str = "") -> Response:
    _check(view, tenant, base)
    kb = next((b for b in (await view.ask(knowledge.KB_LIST, BaseQuery(tenant=tenant))).bases if b.name == base), None)
    if kb is None:
        raise Refused(404, no_base(tenant, base))
    tree = (await view.ask(knowledge.DOC_LIST, BaseRef(name=base, tenant=tenant))).documents
    return view.render("knowledge_base.html", status=status, active="knowledge", kb=kb, tree=tree, error=error)


@get("/knowledge/{tenant:str}/{base:str}")
async def base_page(view: View, tenant: str, base: str) -> Response:
    """A base's tree, the upload form and each document's forget button."""
    return await _tree(view, tenant, base)


@post("/knowledge/{tenant:str}/{base:str}/upload", request_max_body_size=MOST_BYTES + 65536)
async def upload(view: View, tenant: str, base: str) -> Response:
    """A document sent in: read at once (refused saying why), embedded in the background."""
    _check(view, tenant, base)
    sent = (await view.request.form()).get("file")
    if not isinstance(sent, UploadFile) or not sent.filename:
        return await _tree(view, tenant, base, 400, view.t("knowledge.err.no_file"))
    folder = view.form.get("folder", "").strip().strip("/")
    path = f"{folder}/{sent.filename}" if folder else sent.filename
    store = view.console.gateway.knowledge
    if store is None:
        raise Refused(503, OPENING)
    try:
        doc = await store.upload(tenant, base, path, await sent.read(), view.by)
    except Exception as exc:  # BadRequest / NotFound: the service's own words on the page
        message = getattr(exc, "message", None)
        if message is None:
            raise
        return await _tree(view, tenant, base, 400 if "404" not in getattr(exc, "code", "") else 404, message)
    return view.done(f"{PREFIX}/knowledge/{tenant}/{base}", view.t("knowledge.sent", path=doc.path))


@post("/knowledge/{tenant:str}/{base:str}/forget")
async def forget(view: View, tenant: str, base: str) -> Response:
    """A document (or a folder's, a path ending in '/') forgotten."""
    _check(view, tenant, base)
    path = view.form.get("path", "")
    gone = await view.ask(knowledge.DOC_REMOVE, DocRef(base=base, path=path or "-", tenant=tenant, by=view.by))
    return view.done(f"{PREFIX}/knowledge/{tenant}/{base}", view.t("knowledge.forgotten", n=len(gone.documents)))


ROUTES = (bases_page, base_page, upload, forget)
