"""The corpus endpoints' body check (``lookahead.plugin.corpus_server.JsonBodyCheck``)
on a FastAPI app with routes that read the body as SGLang's do; the real
server's answers are checked in ``tests/e2e/test_e2e_fleet.py``."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from lookahead.plugin.corpus_server import JsonBodyCheck, body_problem


@pytest.fixture(scope="module")
def client():
    app = FastAPI()

    @app.post("/add_external_corpus")
    async def add(request: Request):
        return {"success": True, "got": await request.json()}

    @app.post("/remove_external_corpus")
    async def remove(request: Request):
        body = await request.json()
        return {"success": True, "corpus_id": body.get("corpus_id")}

    @app.post("/generate")
    async def generate(request: Request):
        return {"raw": (await request.body()).decode()}

    app.add_middleware(JsonBodyCheck)
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("path", ["/add_external_corpus", "/remove_external_corpus"])
@pytest.mark.parametrize("body, why", [(b"{not json", "it is not JSON"), (b"", "it is not JSON"),
                                       (b"[1, 2]", "got list"), (b"\xff\xfe", "it is not JSON"),
                                       (b'"text"', "got str")])
def test_a_body_that_is_no_json_object_gets_400_with_a_message(client, path, body, why):
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    out = r.json()
    assert out["success"] is False and why in out["message"] and path in out["message"], out


def test_good_bodies_and_other_routes_pass_unchanged(client):
    big = {"corpus_id": "c", "documents": ["x" * 200_000]}  # several ASGI body chunks
    r = client.post("/add_external_corpus", json=big)
    assert r.status_code == 200 and r.json()["got"] == big
    r = client.post("/remove_external_corpus", json={"corpus_id": "c"})
    assert r.status_code == 200 and r.json()["corpus_id"] == "c"
    r = client.post("/generate", content=b"{not json")  # not a corpus route: untouched
    assert r.status_code == 200 and r.json()["raw"] == "{not json"


def test_body_problem():
    assert body_problem(b'{"corpus_id": "x"}') is None
    assert "JSON object" in body_problem(b"null")
