"""The embedded engine against llama.cpp on the default model's own GGUF: prefill, decode by batch, KV reuse.

The default model (SmolLM2-135M-Instruct) ships as a Q4_1 GGUF; the embedded engine runs a dequantized
safetensors copy of it (float32, bfloat16, and bfloat16 with `engine.quantize = "int4"`, its linears
quantized again to 4 bits in Q4_1's layout; `--dtypes` picks), llama.cpp (llama-cpp-python, in
its own interpreter) runs the GGUF itself, Q4_1: the comparison a user makes with the same file. Both on
`--threads` CPU threads, greedy, one after the other in one run.

- prefill: tokens/s of one `--prompt-tokens` prompt (1 new token), and of 8 such prompts at once.
- decode b1 / b8 / b64: that many requests together, `--new-tokens` each (EOS ignored), prompts of
  `--decode-prompt-tokens`; tokens/s = tokens of the decode steps / their wall time (the prefill that
  gives each request its first token is left out). The engine gets every request in its first step
  (paused while they queue); llama.cpp decodes the sequences in one `llama_batch` per step (one
  sequence id each, as its server batches slots), through llama-cpp-python's low-level API.
- KV reuse: a 5-turn tool-using episode (a tools system prompt, then per turn the model's tool call and
  the tool's result), each turn's prompt the exact tokens of the previous prompt and reply plus the new
  messages (as the proxy continues a session). Prompt tokens vs. tokens computed: the engine's counters
  (its prefix cache), and for llama.cpp the tokens its `Llama` evaluated (it keeps the previous
  sequence's KV and evaluates past the longest common prefix).

llama.cpp first runs as built (its AMX / repacked-weight buffers included); if a small probe kills its
worker (ggml's AMX kernels die with SIGILL on some VMs whose CPUs report AMX), it runs again without those
buffers (`use_extra_bufts = false`) and the report says so.

llama.cpp's interpreter: `--llama-python`, else $AREAL_LLAMA_PYTHON, else this one if it imports
llama_cpp, else ~/.cache/areal-proxy/llamacpp/venv/bin/python; without one, only the engine's columns are
printed. A separate venv keeps llama-cpp-python (a CPU build from source, ~20 minutes on 2 cores) out of
the project's:

    python3 -m venv ~/.cache/areal-proxy/llamacpp/venv
    ~/.cache/areal-proxy/llamacpp/venv/bin/pip install llama-cpp-python
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine_throughput.py [--dtypes float32 bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the default model is local: never reach for the hub

from proxy.engines.base import SamplingParams, generate  # noqa: E402
from proxy.engines.config import EngineConfig  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from proxy.render import ParentTokens, Renderer  # noqa: E402
from proxy.runtime.model_files import DEFAULT_MODEL, _gguf_source, resolve_model  # noqa: E402

BATCHES = (1, 8, 64)
PREFILL_BATCH = 8
LLAMA_VENV = str(Path("~/.cache/areal-proxy/llamacpp/venv/bin/python").expanduser())

FILLER = (
    "The committee reviewed the quarterly figures for the northern warehouses, noting that shipments of "
    "spare parts rose while returns fell, and asked the logistics team to explain the delays at the river "
    "port, where two cranes were out of service for most of March and the night shift was short of staff. "
)

# -- the episode ---------------------------------------------------------------------------------

SYSTEM = "You are a research agent. Look facts up with the tools before you answer, one call at a time."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web and return the top results with a snippet each.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to search for"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fetch_page",
            "description": "Fetch a web page and return its main text.",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string", "description": "the page's address"}},
                "required": ["url"],
            },
        },
    },
]
QUESTION = (
    "When was the Eiffel Tower completed, how tall is it today, and how does that compare with the "
    "Empire State Building? Check each number with a search."
)
CALL_OPENING = '<tool_call>\n{"name": "search", "arguments": {"query": "'  # a required call's opening
TURNS = 5
REPLY_TOKENS = 40


def tool_result(turn: int) -> str:
    results = [
        {
            "title": f"Result {turn}.{i}: landmark heights and dates",
            "url": f"https://example.org/landmarks/{turn}/{i}",
            "snippet": (
                f"Entry {turn}.{i}. The Eiffel Tower was completed in March 1889 for the World's Fair; with "
                "its antennas it now stands about 330 metres tall. The Empire State Building, finished in "
                "1931, reaches 443 metres to the tip of its antenna and 381 metres to its roof."
            ),
        }
        for i in range(3)
    ]
    return json.dumps(results)


async def episode(renderer: Renderer, turn_fn: Any) -> dict:
    """Five calls of one session, each prompt continuing the previous prompt + reply token for token.

    `turn_fn(ids) -> (output_ids, tokens computed)` runs one call."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    parent = None
    turns = []
    started = time.perf_counter()
    for turn in range(TURNS):
        prompt = renderer.prompt(messages, TOOLS, parent, CALL_OPENING)
        new = len(prompt.ids) - (len(parent.full_ids) if parent is not None and prompt.parent_used else 0)
        t0 = time.perf_counter()
        out, computed = await turn_fn(prompt.ids)
        turns.append(
            {
                "prompt": len(prompt.ids),
                "new": new,
                "computed": computed,
                "reply": len(out),
                "continued": prompt.parent_used,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        reply = renderer.tokenizer.decode(out, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": CALL_OPENING + reply})
        parent = ParentTokens(prompt.ids + out, len(messages), renderer.ends_with_eos(out))
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": tool_result(turn)})
    return {
        "prompt_tokens": sum(t["prompt"] for t in turns),
        "new_tokens": sum(t["new"] for t in turns),
        "computed_tokens": sum(t["computed"] for t in turns),
        "seconds": round(time.perf_counter() - started, 2),
        "turns": turns,
    }


# -- prompts ----------------------------------------------------------------------------------------


def make_prompt(tokenizer: Any, index: int, length: int) -> list[int]:
    """A chat prompt of exactly `length` tokens, different from every other `index` from its first block."""
    head = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    body: list[int] = tokenizer.encode(f"Request {index}. ", add_special_tokens=False)
    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    need = length - len(head) - len(tail)
    while len(body) < need:
        body += filler
    return head + body[:need] + tail


# -- the embedded engine ----------------------------------------------------------------------------


async def _together(engine: LocalEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """All prompts queued while the engine is paused, so they start in one step; per request the
    arrival times of its first and last tokens."""
    await engine.pause()
    firsts: list[float] = []
    lasts: list[float] = []
    counts: list[int] = []

    async def one(i: int) -> None:
        n, first = 0, 0.0
        async for delta in engine.stream(prompts[i], params, request_id=f"r{time.monotonic_ns()}-{i}"):
            if n == 0:
                first = time.perf_counter()
            n += len(delta.token_ids)
        firsts.append(first)
        lasts.append(time.perf_counter())
        counts.append(n)

    steps = engine.stats["steps"]
    jobs = [asyncio.create_task(one(i)) for i in range(len(prompts))]
    while engine.in_flight < len(prompts):
        await asyncio.sleep(0.001)
    started = time.perf_counter()
    engine.resume()
    await asyncio.gather(*jobs)
    return {
        "started": started,
        "first": max(firsts),
        "end": max(lasts),
        "tokens": sum(counts),
        "rows": len(prompts),
        "steps": engine.stats["steps"] - steps,
    }


async def run_ours(variant: str, tokenizer: Any, args: argparse.Namespace) -> dict:
    dtype, _, quantize = variant.partition("-")
    engine = LocalEngine(EngineConfig(dtype=dtype, threads=args.threads, quantize=quantize or "none"))
    await engine.start()
    out: dict[str, Any] = {"dtype": variant, "lean_forward": engine._fast is not None}
    try:
        greedy1 = SamplingParams(max_new_tokens=1, temperature=0.0)
        serial = iter(range(10**6))  # prompt indexes: no two runs share a cached block

        def prompts(n: int, length: int) -> list[list[int]]:
            return [make_prompt(tokenizer, next(serial), length) for _ in range(n)]

        # prefill: one prompt (best of reps), then PREFILL_BATCH prompts at once
        await _together(engine, prompts(1, args.prompt_tokens), greedy1)  # warm-up
        times = []
        for _ in range(args.reps):
            r = await _together(engine, prompts(1, args.prompt_tokens), greedy1)
            times.append(r["end"] - r["started"])
        out["prefill"] = args.prompt_tokens / min(times)
        await _together(engine, prompts(PREFILL_BATCH, args.prompt_tokens), greedy1)  # warm-up
        r = await _together(engine, prompts(PREFILL_BATCH, args.prompt_tokens), greedy1)
        out[f"prefill_x{PREFILL_BATCH}"] = PREFILL_BATCH * args.prompt_tokens / (r["end"] - r["started"])

        # decode: b requests together, new_tokens each, EOS ignored
        for b in BATCHES:
            warm = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
            await _together(engine, prompts(b, args.decode_prompt_tokens), warm)
            params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
            r = await _together(engine, prompts(b, args.decode_prompt_tokens), params)
            seconds = r["end"] - r["first"]
            out[f"decode_b{b}"] = (r["tokens"] - b) / seconds
            out[f"decode_b{b}_ms_per_step"] = 1000 * seconds / max(r["steps"] - 1, 1)

        # KV reuse over one agent's turns (the engine's prefix cache, default size)
        renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
        reply = SamplingParams(max_new_tokens=REPLY_TOKENS, temperature=0.0)
        calls = iter(range(TURNS))

        async def turn(ids: list[int]) -> tuple[list[int], int]:
            before = engine.stats["prefill_tokens"]
            result = await generate(engine, ids, reply, request_id=f"episode-{next(calls)}", affinity="episode")
            return result.output_ids, engine.stats["prefill_tokens"] - before

        out["episode"] = await episode(renderer, turn)
    finally:
        await engine.stop()
    return out


# -- llama.cpp, in its own interpreter ---------------------------------------------------------------

WORKER = r'''
"""llama.cpp side of benchmarks/engine_throughput.py: one JSON request per stdin line, one JSON answer per line."""
import ctypes, json, sys, time

import numpy as np
import llama_cpp as lc

MODEL, THREADS, EXTRA_BUFTS = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
_default_params = lc.llama_cpp.llama_model_default_params


def model_params():
    """Without EXTRA_BUFTS, weights stay in plain CPU buffers: no AMX / repacked copies."""
    p = _default_params()
    p.use_extra_bufts = EXTRA_BUFTS
    return p


lc.llama_cpp.llama_model_default_params = model_params  # what `Llama` reads too
lc.llama_backend_init()
model = lc.llama_model_load_from_file(MODEL.encode(), model_params())
vocab_n = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
_llm = None


def context(n_ctx, n_seq, n_batch):
    p = lc.llama_context_default_params()
    p.n_ctx, p.n_seq_max, p.n_batch = n_ctx, n_seq, n_batch
    p.n_ubatch = min(n_batch, 512)
    p.n_threads = p.n_threads_batch = THREADS
    ctx = lc.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    return ctx


def fill(batch, items):
    """items: (token, pos, seq, wants_logits)."""
    for i, (tok, pos, seq, out) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, out
        batch.seq_id[i][0] = seq
    batch.n_tokens = len(items)


def decode(ctx, batch, rows):
    if lc.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    return np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(rows, vocab_n)).argmax(axis=1)


def prompts_items(prompts):
    return [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, t in enumerate(p)]


def prefill(prompts, reps):
    """Best seconds of one llama_decode over all prompts (one sequence each), memory cleared each time."""
    n_tok = sum(len(p) for p in prompts)
    per_seq = -(-(max(len(p) for p in prompts) + 16) // 256) * 256
    ctx = context(per_seq * len(prompts), len(prompts), max(n_tok, 512))
    batch = lc.llama_batch_init(n_tok, 0, len(prompts))
    best = float("inf")
    try:
        for _ in range(reps + 1):  # the first is a warm-up
            lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
            fill(batch, prompts_items(prompts))
            t0 = time.perf_counter()
            decode(ctx, batch, len(prompts))
            best = min(best, time.perf_counter() - t0)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return {"seconds": best}


def batch_decode(prompts, new_tokens):
    """All prompts prefilled in one batch, then new_tokens - 1 steps of one token per sequence."""
    n = len(prompts)
    n_tok = sum(len(p) for p in prompts)
    per_seq = -(-(max(len(p) for p in prompts) + new_tokens + 16) // 256) * 256
    ctx = context(per_seq * n, n, max(n_tok, 512))
    batch = lc.llama_batch_init(max(n_tok, n), 0, n)
    try:
        fill(batch, prompts_items(prompts))
        nxt = decode(ctx, batch, n)
        t0 = time.perf_counter()
        for step in range(new_tokens - 1):
            fill(batch, [(int(nxt[s]), len(p) + step, s, True) for s, p in enumerate(prompts)])
            nxt = decode(ctx, batch, n)
        seconds = time.perf_counter() - t0
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return {"seconds": seconds, "tokens": n * (new_tokens - 1)}


def turn(ids, max_tokens, n_ctx):
    """One call of a session on a Llama kept across calls: it reuses the KV of its longest common prefix."""
    global _llm
    if _llm is None:
        _llm = lc.Llama(MODEL, n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
        plain_eval = _llm.eval

        def counted(tokens):
            if _llm.evaluated is None:  # generate's first eval: the prompt past the reused prefix
                _llm.evaluated = len(tokens)
            return plain_eval(tokens)

        _llm.eval = counted
    _llm.evaluated = None
    eos = _llm.token_eos()
    out = []
    for tok in _llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if tok == eos or len(out) >= max_tokens:
            break
    return {"output": out, "evaluated": _llm.evaluated}


def info():
    return {
        "version": lc.__version__,
        "system_info": lc.llama_print_system_info().decode(),
        "extra_bufts": EXTRA_BUFTS,
    }


def probe():
    """A small prefill and decode: a build whose kernels the CPU cannot run dies here."""
    prefill([list(range(100, 164))], 0)
    batch_decode([list(range(100, 116)), list(range(200, 216))], 4)
    return {}


print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    op = req.pop("op")
    try:
        answer = {"info": info, "probe": probe, "prefill": prefill, "decode": batch_decode, "turn": turn}[op](**req)
    except Exception as exc:  # report, keep serving
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer), flush=True)
'''


class LlamaWorker:
    """The worker above in `python`, driven by JSON lines."""

    def __init__(self, python: str, gguf: Path, threads: int, extra_bufts: bool) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="llamacpp-")
        script = Path(self._dir.name) / "llamacpp_worker.py"
        script.write_text(WORKER)
        self.proc = subprocess.Popen(
            [python, str(script), str(gguf), str(threads), "1" if extra_bufts else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited ({self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"llama.cpp worker: {answer['error']}")
        return answer

    def call(self, op: str, **kwargs: Any) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)
        self._dir.cleanup()


def llama_python(arg: str | None) -> str | None:
    if arg:
        return arg
    if os.environ.get("AREAL_LLAMA_PYTHON"):
        return os.environ["AREAL_LLAMA_PYTHON"]
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode == 0:
        return sys.executable
    return LLAMA_VENV if Path(LLAMA_VENV).exists() else None


async def run_llama(python: str, tokenizer: Any, eos_ids: tuple[int, ...], args: argparse.Namespace) -> dict:
    worker = LlamaWorker(python, _gguf_source(), args.threads, extra_bufts=True)
    note = ""
    try:
        worker.call("probe")
    except RuntimeError as exc:  # e.g. SIGILL in the AMX kernels: go on with plain CPU buffers
        worker.close()
        note = f"with llama.cpp's extra buffer types (AMX / repacked weights) the worker died ({exc}); without them"
        print(f"llama.cpp: {note}", flush=True)
        worker = LlamaWorker(python, _gguf_source(), args.threads, extra_bufts=False)
        worker.call("probe")
    try:
        out: dict[str, Any] = {"dtype": "Q4_1 (GGUF)", "note": note, **worker.call("info")}
        serial = iter(range(10**6, 2 * 10**6))

        def prompts(n: int, length: int) -> list[list[int]]:
            return [make_prompt(tokenizer, next(serial), length) for _ in range(n)]

        r = worker.call("prefill", prompts=prompts(1, args.prompt_tokens), reps=args.reps)
        out["prefill"] = args.prompt_tokens / r["seconds"]
        r = worker.call("prefill", prompts=prompts(PREFILL_BATCH, args.prompt_tokens), reps=1)
        out[f"prefill_x{PREFILL_BATCH}"] = PREFILL_BATCH * args.prompt_tokens / r["seconds"]
        for b in BATCHES:
            worker.call("decode", prompts=prompts(b, args.decode_prompt_tokens), new_tokens=4)  # warm-up
            r = worker.call("decode", prompts=prompts(b, args.decode_prompt_tokens), new_tokens=args.new_tokens)
            out[f"decode_b{b}"] = r["tokens"] / r["seconds"]
            out[f"decode_b{b}_ms_per_step"] = 1000 * r["seconds"] / (args.new_tokens - 1)

        renderer = Renderer(tokenizer, eos_ids)

        async def turn(ids: list[int]) -> tuple[list[int], int]:
            r = worker.call("turn", ids=ids, max_tokens=REPLY_TOKENS, n_ctx=4096)
            return r["output"], r["evaluated"]

        out["episode"] = await episode(renderer, turn)
        return out
    finally:
        worker.close()


# -- report ------------------------------------------------------------------------------------------


def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    ours = [k for k in results if k != "llama.cpp"]
    llama = results.get("llama.cpp")
    names = {k: f"engine {results[k]['dtype']}" for k in ours}
    header = ["tokens/s", *names.values()]
    if llama:
        header += ["llama.cpp (Q4_1 GGUF)", *(f"{names[k]} / llama.cpp" for k in ours)]
    rows = [
        ("prefill", f"prefill 1×{args.prompt_tokens}"),
        (f"prefill_x{PREFILL_BATCH}", f"prefill {PREFILL_BATCH}×{args.prompt_tokens}"),
        *((f"decode_b{b}", f"decode batch {b}") for b in BATCHES),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, label in rows:
        cells = [label, *(f"{results[k][key]:,.0f}" for k in ours)]
        if llama:
            cells.append(f"{llama[key]:,.0f}")
            cells += [f"{results[k][key] / llama[key]:.2f}×" for k in ours]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for key in [*ours, *(["llama.cpp"] if llama else [])]:
        e = results[key]["episode"]
        name = names.get(key, "llama.cpp")
        lines.append(
            f"KV reuse, {TURNS}-turn tool episode, {name}: computed {e['computed_tokens']:,} of "
            f"{e['prompt_tokens']:,} prompt tokens ({e['computed_tokens'] / e['prompt_tokens']:.0%}); "
            f"new to the session: {e['new_tokens']:,}; per turn computed/prompt "
            + ", ".join(f"{t['computed']}/{t['prompt']}" for t in e["turns"])
            + f"; {e['seconds']:.1f} s"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, EngineConfig().cache_dir))
    results: dict[str, dict] = {}
    for dtype in args.dtypes:
        results[dtype] = await run_ours(dtype, tokenizer, args)
        print(json.dumps({dtype: {k: v for k, v in results[dtype].items() if k != "episode"}}), flush=True)
    python = llama_python(args.llama_python)
    if python is None or args.no_llama:
        print("llama.cpp skipped: no interpreter with llama_cpp (--llama-python, $AREAL_LLAMA_PYTHON)", flush=True)
    else:
        eos = tuple(sorted({tokenizer.eos_token_id}))
        results["llama.cpp"] = await run_llama(python, tokenizer, eos, args)
        summary = {k: v for k, v in results["llama.cpp"].items() if k not in ("episode", "system_info")}
        print(json.dumps({"llama.cpp": summary}), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dtypes",
        nargs="*",
        default=["float32", "bfloat16", "bfloat16-int4"],
        choices=["float32", "bfloat16", "bfloat16-int4"],
        help="engine variants: weights dtype, and -int4 for engine.quantize = int4",
    )
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of both engines")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prefill prompt length")
    parser.add_argument("--decode-prompt-tokens", type=int, default=64, help="prompt length of the decode runs")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per decode request")
    parser.add_argument("--reps", type=int, default=3, help="single-prompt prefills timed (best taken)")
    parser.add_argument("--llama-python", help="interpreter with llama-cpp-python")
    parser.add_argument("--no-llama", action="store_true", help="only the embedded engine")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    results = asyncio.run(main_async(args))
    meta = {
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "prompt_tokens": args.prompt_tokens,
        "decode_prompt_tokens": args.decode_prompt_tokens,
        "new_tokens": args.new_tokens,
        "seconds": round(time.perf_counter() - started, 1),
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: others' load
    }
    print(f"\n{args.threads} threads each; 1-minute load average before/after: {meta['loadavg_1min']}\n")
    print(table(results, args))
    if "llama.cpp" in results:
        llama = results["llama.cpp"]
        print(f"\nllama-cpp-python {llama['version']}: {llama['system_info'].strip()}")
        if llama["note"]:
            print(f"llama.cpp ran {llama['note']}")
    if args.json:
        Path(args.json).write_text(json.dumps({**meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
