"""The catalog reads a model's file header, through the mirror, before it accepts the model:
a file that is not GGUF is refused at put, not after four engine starts."""

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
    mirror = await serve(Mirror(MirrorConfig(root=str(root))), MirrorConfig())
    await mirror.ctx.nc.flush()  # its endpoints' subscriptions are the server's before anyone asks
    if request.param == "own role":
        await (await serve(Catalog(CatalogConfig()), CatalogConfig())).ctx.nc.flush()
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
