"""`engine.seed` seeds the embedded engine's draws for requests that carry no seed: a fresh engine
sent the same requests one at a time samples the same tokens, and another seed other tokens."""

from __future__ import annotations

from tests.engines.conftest import run_engine

PROMPT = [1, 9690, 198, 2683, 314, 260]


def draws(tmp, seed: int) -> list[list[int]]:
    tmp.mkdir()
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}}
    with run_engine(tmp, "--set", f"engine.seed={seed}") as engine:
        out = []
        for _ in range(3):
            r = engine.post("/generate", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["output_ids"])
        return out


def test_a_fresh_engine_draws_the_same_tokens_from_its_seed(tmp_path):
    first = draws(tmp_path / "a", 7)
    assert len({tuple(ids) for ids in first}) > 1, "each request draws on from where the last left off"
    assert draws(tmp_path / "b", 7) == first
    assert draws(tmp_path / "c", 8) != first
