"""Loading what a run is made of: the agent and the dataset, from config strings.

Agent: `module:function` or `path/to/file.py:function` naming
`async def run(task, base_url, api_key)`, or a shell command (anything with a
space) run once per episode with OPENAI_BASE_URL / OPENAI_API_KEY /
ANTHROPIC_BASE_URL / AREAL_TASK set.
Dataset: `module:function` or `file.py:function` returning an iterable of task
dicts (called with `split` and `seed`), a `.jsonl` file, or `hf:owner/name[:config][:split]`
(needs the `datasets` package). A task is a dict; `id` and `reference` are used
when present (GSM8K rows: the reference is the `answer`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def load_object(spec: str) -> Any:
    """`module:attr` or `path/file.py:attr`."""
    if ":" not in spec:
        raise ValueError(f"{spec!r}: expected module:function or path/file.py:function")
    target, attr = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found")
        name = f"_areal_user_{path.stem}_{abs(hash(str(path)))}"
        module = sys.modules.get(name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"{target} has no {attr!r}") from None


def is_command(agent: str) -> bool:
    return " " in agent.strip() or ":" not in agent


def load_agent(agent: str) -> Callable[..., Any]:
    fn = load_object(agent)
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{agent}: the agent must be `async def run(task, base_url, api_key)`")
    return fn


def _task_id(task: dict[str, Any], index: int) -> str:
    return str(task.get("id", task.get("task_id", index)))


def normalise_task(task: dict[str, Any], index: int) -> dict[str, Any]:
    out = dict(task)
    out["id"] = _task_id(task, index)
    if "reference" not in out and "answer" in out:
        out["reference"] = out["answer"]
    return out


def load_tasks(dataset: str, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    if not dataset:
        raise ValueError("rollout.dataset is empty: name a module:function, a .jsonl file, or hf:owner/name")
    if dataset.startswith("hf:"):
        return _hf_tasks(dataset[3:], split)
    if dataset.endswith(".jsonl"):
        with open(dataset) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [normalise_task(r, i) for i, r in enumerate(rows)]
    fn = load_object(dataset)
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in (("split", split), ("seed", seed)) if k in params}
    rows: Iterable[dict[str, Any]] = fn(**kwargs)
    return [normalise_task(r, i) for i, r in enumerate(rows)]


def _hf_tasks(spec: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ImportError("hf: datasets need the `datasets` package: pip install 'areal-proxy[datasets]'") from None
    parts = spec.split(":")
    name, config = parts[0], parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 else split
    rows = datasets.load_dataset(name, config, split=split)
    return [normalise_task(dict(r), i) for i, r in enumerate(rows)]
