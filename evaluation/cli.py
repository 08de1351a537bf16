"""`areal-proxy eval`: a config's agent on its held-out split, through a proxy serving the model asked.

For each model (the config's, `--model`, and `--compare`'s), a proxy is started on a free port over
the config's store with that model, the evaluation runs through it (`evaluation/run.py`), and the
proxy stops; `--url` evaluates through a proxy already running instead (a training run's: its
current policy). Both models of a comparison run the same tasks from the same seeds, and the paired
difference is reported. The report is printed as tables and written as JSON (`--out`, by default
`{trainer.run_dir}/evals/{name}.json`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from proxy.config import ADMIN_KEY_ENV, Config, public_config


def model_to_serve(cfg: Config, model: str) -> str:
    """`best` and `latest` name the run's checkpoints; anything else is a model id or path."""
    from trainer import checkpoint

    run_dir = Path(cfg.trainer.run_dir)
    if model == "best":
        record = run_dir / "checkpoints" / "best.json"
        if not record.is_file():
            raise FileNotFoundError(f"{record} does not exist: no evaluation during training has ranked checkpoints")
        best = json.loads(record.read_text())
        return best.get("path") or best["model"]
    if model == "latest":
        latest = checkpoint.latest(run_dir)
        if latest is None:
            raise FileNotFoundError(f"{run_dir / 'checkpoints'} holds no checkpoint")
        return str(latest)
    return model


def _through(cfg: Config, url: str, name: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """Evaluation `name` through the proxy at `url`, reported from the config's store."""
    from evaluation.run import evaluate
    from proxy.store.db import Database

    db = Database(cfg.store)
    try:
        return asyncio.run(evaluate(cfg, url, db, name, metadata=metadata))
    finally:
        db.close()


def _serve_and_evaluate(cfg: Config, model: str, name: str, workdir: Path) -> dict[str, Any]:
    """Start a proxy serving `model` over the config's store, evaluate through it, stop it."""
    from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy, write_private
    from trainer.loop import proxy_url

    served = cfg.model_copy(deep=True)
    served.engine.model = model
    served.proxy.port = free_port()
    served.proxy.host = "127.0.0.1"
    served.proxy.public_url = ""
    served.proxy.admission = False
    config_file = workdir / f"{name}.config.json"
    write_private(config_file, json.dumps(public_config(served), indent=2))
    env = {ADMIN_KEY_ENV: cfg.proxy.admin_key} if cfg.proxy.admin_key else {}
    log_path = workdir / f"{name}.proxy.log"
    proc = start_process([sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_file)], log_path, env=env)
    try:
        url = proxy_url(served)
        wait_healthy(url, proc, timeout=900, log_path=log_path)
        return _through(served, url, name, {"model": model})
    finally:
        stop_process(proc)


def run_eval(
    cfg: Config,
    *,
    model: str | None = None,
    compare: str | None = None,
    url: str | None = None,
    name: str | None = None,
    out: str | None = None,
) -> tuple[dict[str, Any], Path]:
    """Evaluate (and compare); the JSON written and where."""
    from evaluation.report import compare as paired
    from evaluation.run import new_run_name

    if url and compare:
        raise ValueError("--compare starts a proxy for each model: leave out --url")
    first = model_to_serve(cfg, model or cfg.engine.model)
    runs: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="areal-eval-") as tmp:
        workdir = Path(tmp)
        for i, m in enumerate([first] + ([model_to_serve(cfg, compare)] if compare else [])):
            # unique even when --name repeats: a run's sessions are found by its name
            label = new_run_name(f"{name or 'eval'}-{'ab'[i]}" if compare else name or "eval")
            if url:
                report = _through(cfg, url.rstrip("/"), label, {"model": m, "url": url})
            else:
                report = _serve_and_evaluate(cfg, m, label, workdir)
            runs.append((m, report))
    result: dict[str, Any] = {"model": runs[0][0], "report": runs[0][1]}
    if compare:
        result["compare"] = {"model": runs[1][0], "report": runs[1][1], "difference": paired(runs[0][1], runs[1][1])}
    path = Path(out) if out else Path(cfg.trainer.run_dir) / "evals" / f"{runs[0][1]['run']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result, path


def print_result(result: dict[str, Any], path: Path) -> None:
    from rich.console import Console

    from evaluation.report import render

    other = result.get("compare")
    console = Console()
    console.print(render(result["report"], other["difference"] if other else None, other["report"] if other else None))
    console.print(f"report: {path}")
