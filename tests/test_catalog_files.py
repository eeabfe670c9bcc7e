"""The catalog reads a model's file header, through the mirror, before it accepts the model:
a file that is not GGUF is refused at put, not after four engine starts."""

import asyncio

import nats.micro
import pytest

from llmgw.bus import BadRequest, Context, call
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.gguf import write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Model, ModelPut, ModelRef, catalog


@pytest.fixture(params=["own role", "unrestricted"])
async def client(request, serve, nc, tmp_path):
    """A mirror holding a GGUF file and a web page saved as one, and a catalog: on a connection
    with its own role's permissions, or on the tests' unrestricted one (the check's logic alone)."""
    root = tmp_path / "mirror"
    (root / "o/r").mkdir(parents=True)
    write_random_llama(root / "o/r/good.gguf")
    (root / "o/r/page.gguf").write_bytes(b"<!doctype html><title>404</title>" * 100)
    await serve(Mirror(MirrorConfig(root=str(root))), MirrorConfig())
    if request.param == "own role":
        await serve(Catalog(CatalogConfig()), CatalogConfig())
        yield nc
        return
    app = Catalog(CatalogConfig())
    service = await nats.micro.add_service(nc, name="llmgw-catalog", version=app.version)
    await app.start(Context(app, CatalogConfig(), nc, service))
    yield nc
    await app.stop()
    await service.stop()


async def test_a_model_whose_file_is_not_gguf_is_refused_at_put_and_not_stored(client):
    with pytest.raises(BadRequest, match="its file o/r/page.gguf: not a GGUF file \\(it starts with b'<!do'"):
        await call(client, catalog.MODEL_PUT, ModelPut(model=Model(name="page", source="o/r/page.gguf")))
    with pytest.raises(Exception, match="not in the catalog"):
        await call(client, catalog.MODEL_GET, ModelRef(name="page"))


async def test_a_model_whose_file_reads_or_is_not_on_the_mirror_yet_is_accepted(client):
    await call(client, catalog.MODEL_PUT, ModelPut(model=Model(name="good", source="o/r/good.gguf")))
    await call(client, catalog.MODEL_PUT, ModelPut(model=Model(name="later", source="o/r/later.gguf")))
    assert (await call(client, catalog.MODEL_GET, ModelRef(name="good"))).model.source == "o/r/good.gguf"


async def test_a_pinned_source_the_mirror_does_not_hold_is_refused_with_what_it_holds(serve, nc, tmp_path):
    """A model may name 'OWNER/REPO@COMMIT/FILE' only once the mirror fetched and verified it."""
    from llmgw.hubstandin import HubStandIn
    from llmgw.proto import RepoAdd, RepoRef
    from llmgw.proto import mirror as mirror_api

    gguf = tmp_path / "m.gguf"
    write_random_llama(gguf)
    with HubStandIn() as hub:
        commit = hub.add_repo("org/m", {"m.gguf": gguf})
        config = MirrorConfig(root=str(tmp_path / "mirror"), hub_endpoint=hub.url, keep_free_bytes=0)
        await serve(Mirror(config), config)
        await serve(Catalog(CatalogConfig()), CatalogConfig())
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m"))
        for _ in range(200):
            if (await call(nc, mirror_api.REPO_SHOW, RepoRef(repo="org/m"))).repos[0].state == "ready":
                break
            await asyncio.sleep(0.05)
    wrong = f"org/m@{'0' * 40}/m.gguf"
    with pytest.raises(
        BadRequest, match=rf"model 'm': the mirror holds no file '{wrong}'.*it holds org/m@{commit}/m.gguf"
    ):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="m", source=wrong)))
    entry = await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="m", source=f"org/m@{commit}/m.gguf")))
    assert entry.model.source == f"org/m@{commit}/m.gguf"
