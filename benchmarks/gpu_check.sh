#!/usr/bin/env bash
# GPU check: the embedded engine and a training step on CUDA with a ~0.5B model, in under 10 minutes.
#
#   benchmarks/gpu_check.sh              # one CUDA GPU: ~0.5B randomly initialised Llama
#   benchmarks/gpu_check.sh --cpu --tiny # smoke test of the script itself on CPU with a tiny model
#
# 1. Builds a LlamaConfig of ~0.5B parameters (hidden 1024, 24 layers, 16 heads, intermediate 4096,
#    vocab 49152), saves random weights with save_pretrained, with the default model's tokenizer.
# 2. Starts `areal-proxy engine --model DIR --device cuda` (the LocalEngine behind SGLang's native
#    API), sends many concurrent /generate requests (ignore_eos, fixed length) and reports
#    generation tokens/s; then loads perturbed weights with /update_weights_from_disk and checks
#    that the new version is reported per token.
# 3. Trains with the project's trainer step (trainer/step.py on trainer/policy.py's model): bf16
#    autocast with fp32 master weights, a GRPO group of TRAIN_BATCH answers to one prompt, full
#    fine-tune and LoRA (rank 16, every linear layer); step time and peak memory of each.
# 4. Runs the arithmetic example (`areal-proxy train examples/arithmetic/config.toml --device cuda`)
#    for --arith-minutes (3) with the default model: steps done and rewards.
# Results are printed as JSON and written to $OUT/gpu_check.json when $OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
exec timeout 590 "$PY" - "$@" <<'PYTHON'
import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

parser = argparse.ArgumentParser(prog="gpu_check.sh")
parser.add_argument("--cpu", action="store_true", help="run on CPU (smoke test)")
parser.add_argument("--tiny", action="store_true", help="a tiny model and short runs (smoke test)")
parser.add_argument("--requests", type=int, help="concurrent generation requests")
parser.add_argument("--new-tokens", type=int, help="tokens generated per request")
parser.add_argument("--train-batch", type=int, help="sequences per training step")
parser.add_argument("--train-len", type=int, help="tokens per training sequence")
parser.add_argument("--arith-minutes", type=float, default=3.0, help="minutes of the arithmetic example's loop")
args = parser.parse_args()

DEVICE = "cpu" if args.cpu else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():
    sys.exit("CUDA is not available; use --cpu --tiny for a smoke test")
TOKENIZER = Path("~/.cache/areal-proxy/models/smollm2-135m-instruct").expanduser()
REQUESTS = args.requests or (8 if args.tiny else 128)
NEW_TOKENS = args.new_tokens or (16 if args.tiny else 256)
PROMPT_LEN = 32 if args.tiny else 128
TRAIN_BATCH = args.train_batch or (2 if args.tiny else 8)
TRAIN_LEN = args.train_len or (64 if args.tiny else 2048)
TRAIN_STEPS = 3 if args.tiny else 10
results: dict = {"device": DEVICE, "tiny": args.tiny}
if DEVICE == "cpu":
    torch.set_num_threads(1)
if DEVICE == "cuda":
    results["gpu"] = torch.cuda.get_device_name(0)


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_model(out: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (TOKENIZER / "tokenizer.json").is_file():
        from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

        resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")  # converts the packaged default once
    size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                intermediate_size=128) if args.tiny else dict(
                hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                intermediate_size=4096)
    config = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, **size)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.float32 if DEVICE == "cpu" else torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (TOKENIZER / name).is_file():
            shutil.copy(TOKENIZER / name, out / name)
    del model
    return config, params


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def generate_load(url: str) -> dict:
    """REQUESTS concurrent /generate calls of NEW_TOKENS tokens each; returns throughput."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (PROMPT_LEN,), generator=gen).tolist() for _ in range(REQUESTS)]
    sampling = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 1.0}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=REQUESTS + 8)) as client:
        async def one(ids):
            body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
            r = await client.post(url + "/generate", json=body)
            r.raise_for_status()
            return r.json()

        await one(prompts[0][:8])  # warm-up (kernels, allocator)
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
    tokens = sum(a["meta_info"]["completion_tokens"] for a in answers)
    assert tokens == REQUESTS * NEW_TOKENS, tokens
    assert all(len(a["meta_info"]["output_token_logprobs"]) == NEW_TOKENS for a in answers)
    return {"requests": REQUESTS, "new_tokens": NEW_TOKENS, "prompt_len": PROMPT_LEN, "seconds": round(wall, 2),
            "generation_tokens_per_s": round(tokens / wall, 1)}


def engine_phase(model_dir: Path, work: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logfile = Path(os.environ.get("OUT") or work) / "engine.log"
    cmd = [sys.executable, "-m", "proxy.cli", "engine", "--model", str(model_dir), "--device", DEVICE,
           "--port", str(port), "--set", f"engine.max_batch_size={max(REQUESTS, 1)}"]
    if DEVICE == "cpu":
        cmd += ["--set", "engine.threads=1"]  # smoke test on a shared machine: no OpenMP spinning
    log("starting " + " ".join(cmd[2:]))
    with open(logfile, "w") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"engine exited with {proc.returncode}:\n{logfile.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > 240:
                raise SystemExit("engine did not start in 240 s:\n" + logfile.read_text()[-3000:])
            time.sleep(0.5)
        results["engine_start_s"] = round(time.perf_counter() - t0, 1)
        results["server_info"] = {k: v for k, v in httpx.get(url + "/server_info").json().items()
                                  if k in ("context_length", "device", "max_running_requests")}
        log(f"engine up in {results['engine_start_s']} s; {REQUESTS} requests x {NEW_TOKENS} tokens")
        results["generation"] = asyncio.run(generate_load(url))
        log(f"generation: {results['generation']}")
        results["weight_update"] = weight_update(url, model_dir, work)
        log(f"weight update: {results['weight_update']}")
        results["engine_stats"] = httpx.get(url + "/health").json()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def weight_update(url: str, model_dir: Path, work: Path) -> dict:
    from safetensors.torch import load_file, save_file

    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    state = {k: (v + 0.01 * torch.randn_like(v.float()).to(v.dtype)) if v.dim() == 2 else v for k, v in state.items()}
    new = work / "step-1"
    new.mkdir()
    save_file(state, str(new / "model.safetensors"))
    t0 = time.perf_counter()
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(new), "weight_version": "1"}, timeout=300)
    seconds = time.perf_counter() - t0
    assert r.status_code == 200 and r.json()["success"], r.text
    body = {"input_ids": list(range(3, 11)), "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
            "return_logprob": True}
    meta = httpx.post(url + "/generate", json=body, timeout=300).json()["meta_info"]
    assert meta["weight_versions"] == [{"version": "1", "start": 0, "end": 4}], meta
    return {"seconds": round(seconds, 2), "version_after": meta["weight_version"]}


def synthetic_groups(vocab: int, pad_id: int = 0) -> list:
    """TRAIN_BATCH answers of TRAIN_LEN // 2 tokens to one shared TRAIN_LEN // 2 prompt: a GRPO group."""
    from trainer.batch import Sample, pack

    gen = torch.Generator().manual_seed(2)
    p, o = TRAIN_LEN // 2, TRAIN_LEN - TRAIN_LEN // 2
    prompt = torch.randint(3, vocab, (p,), generator=gen).tolist()
    samples = []
    for i in range(TRAIN_BATCH):
        answer = torch.randint(3, vocab, (o,), generator=gen).tolist()
        adv = 1.0 if i % 2 else -1.0
        samples.append(Sample(prompt + answer, [0] * p + [1] * o, [0.0] * p + [-2.0] * o, [-1] * p + [0] * o,
                              [0.0] * p + [adv] * o, 1.0))
    return pack(samples, 1 << 20, pad_id)


def train_phase(model_dir: Path, lora: bool) -> dict:
    """The project's trainer step (trainer.step.train_step on trainer.policy.build's model): bf16 autocast,
    fp32 master weights; with `lora`, rank-16 adapters on every linear layer. Peak memory per setting."""
    from proxy.config import Config
    from trainer import policy
    from trainer.config import LoraConfig, TrainerConfig
    from trainer.step import train_step

    tcfg = TrainerConfig(device=DEVICE, autocast_bf16=DEVICE == "cuda", lora=LoraConfig(rank=16) if lora else None)
    tcfg.batch.tokens_per_microbatch = 1 << 20
    cfg = Config(trainer=tcfg)
    device = torch.device(DEVICE)
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    pol = policy.build(cfg, device, str(model_dir), None)
    groups = synthetic_groups(pol.model.config.vocab_size)

    def step() -> float:
        r = train_step(pol.model, pol.optimizer, groups, tcfg, device, 0, pol.reference)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return r.loss

    step()  # warm-up: allocator, kernels, optimizer state
    t0 = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        step()
    wall = time.perf_counter() - t0
    out = {
        "lora": lora, "rows": TRAIN_BATCH, "seq_len": TRAIN_LEN, "steps": TRAIN_STEPS,
        "step_s": round(wall / TRAIN_STEPS, 3),
        "trained_tokens_per_s": round(TRAIN_BATCH * (TRAIN_LEN - TRAIN_LEN // 2) * TRAIN_STEPS / wall, 1),
        "trainable_m": round(sum(p.numel() for p in pol.trainable) / 1e6, 2),
    }
    if DEVICE == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del pol
    log(f"training: {out}")
    return out


def arithmetic_phase(minutes: float, work: Path) -> dict:
    """`areal-proxy train examples/arithmetic/config.toml` on DEVICE for `minutes`: steps and rewards."""
    run = work / "arith"
    cmd = [sys.executable, "-m", "proxy.cli", "train", "examples/arithmetic/config.toml", "--device", DEVICE,
           "--set", f"trainer.run_dir={run}", "--set", f"store.url=sqlite:///{run}/areal.db",
           "--set", f"trainer.max_minutes={minutes}"]
    logfile = Path(os.environ.get("OUT") or work) / "arithmetic.log"
    log("starting " + " ".join(cmd[2:]))
    with open(logfile, "w") as out:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              timeout=60 * minutes + 240)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x] if (
        run / "metrics.jsonl").is_file() else []
    steps = [r for r in rows if "reward_mean" in r]
    return {"returncode": proc.returncode, "minutes": minutes, "steps": len(steps),
            "reward_first": steps[0]["reward_mean"] if steps else None,
            "reward_last": steps[-1]["reward_mean"] if steps else None,
            "train_s_mean": round(sum(r["train_s"] for r in steps) / max(len(steps), 1), 2)}


def main() -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        config, params = build_model(model_dir)
        results["model"] = {"parameters_m": round(params / 1e6, 1), "hidden": config.hidden_size,
                            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
                            "intermediate": config.intermediate_size, "vocab": config.vocab_size}
        log(f"model: {results['model']}")
        engine_phase(model_dir, work)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        results["training"] = [train_phase(model_dir, lora=False), train_phase(model_dir, lora=True)]
        if not args.tiny:
            results["arithmetic"] = arithmetic_phase(args.arith_minutes, work)
            log(f"arithmetic: {results['arithmetic']}")
    results["total_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(results, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)


main()
PYTHON
