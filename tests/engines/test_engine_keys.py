"""An `areal-proxy engine` server with an admin key answers only callers holding it (health checks
excepted, as SGLang's --api-key leaves them open), and a proxy in front of it sends its key."""

from __future__ import annotations

import httpx

from tests.conftest import run_server
from tests.engines.conftest import run_engine

KEY = "engine-secret"
PROMPT = [1, 9690, 198, 2683, 314, 260]


def test_a_keyed_engine_server_refuses_callers_without_its_key(tmp_path):
    with run_engine(tmp_path, env={"AREAL_ADMIN_KEY": KEY}) as engine:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
        assert engine.get("/health").status_code == 200
        refused = engine.post("/generate", json=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == 401
        assert engine.post("/generate", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert engine.post("/update_weights_from_disk", json={"model_path": "/x"}).status_code == 401
        ok = engine.post("/generate", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2
        # a proxy with the same admin key sends it to its engine servers
        backend = ["--set", "engine.backend=sglang", "--set", f'engine.urls=["{engine.url}"]']
        with run_server(tmp_path, f"sqlite:///{tmp_path}/a.db", *backend, admin_key=KEY) as proxy:
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            r = httpx.post(proxy.base_url + "/chat/completions", json=chat, headers=proxy.headers(), timeout=120)
            assert r.status_code == 200, r.text
