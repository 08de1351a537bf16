"""`areal-proxy train` with [trainer.lora] end to end: the trainer trains adapters, pushes them (the engine
merges each and samples with it under the new version), and checkpoints the adapter and the merged model."""

from __future__ import annotations

import json

from safetensors import safe_open

from tests.trainer.test_resume import steps_done, train, write_config
from trainer.metrics import read_metrics


def test_a_lora_run_pushes_adapters_and_checkpoints_them(tmp_path):
    # Groups that all scored alike train too (zero advantage), so every step pushes an adapter.
    config = write_config(
        tmp_path, lora={"rank": 8, "alpha": 16.0}, optim={"lr": 1e-3}, batch={"skip_zero_variance": False}
    )
    proc = train(config, "trainer.max_steps=2")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    run = tmp_path / "run"
    assert steps_done(run) == 2
    rows = [r for r in read_metrics(run) if "version" in r and "loss" in r]
    assert [r["version"] for r in rows] == [1, 2], "each step's adapter was loaded as a new version"
    assert all(r["push_s"] > 0 for r in rows)
    log = (run / "trainer.log").read_text() if (run / "trainer.log").exists() else out
    assert "LoRA rank 8" in log
    final = run / "checkpoints" / "step_0000002"
    adapter = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["peft_type"] == "LORA"
    with safe_open(str(final / "adapter" / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names), "the adapter alone"
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        merged = list(f.keys())
    assert merged and not any("lora" in n for n in merged), "and the merged model, under the base's names"
