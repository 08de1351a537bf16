"""The `areal-proxy` command: serve, train, eval, engine, front, export, sessions, ui, rewards.

Every subcommand takes `--config FILE` and repeatable `--set section.key=value`
overrides; flags like `--port` are shortcuts for such overrides. Heavy imports
(torch, transformers, the web stack) happen only after parsing, so `--help` is
instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from proxy.config import DEVICES, Config, ConfigError, load_config


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML configuration file (default: built-in defaults)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config field, e.g. --set trainer.max_steps=2 (repeatable)",
    )


def _serving(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="interface to bind ([proxy] host)")
    p.add_argument("--port", type=int, help="TCP port ([proxy] port)")
    p.add_argument("--db", help="store URL, sqlite:///path or postgresql+psycopg://... ([store] url)")
    p.add_argument("--model", help="Hugging Face id or local path ([engine] model)")
    p.add_argument("--device", choices=DEVICES, help="engine device ([engine] device)")
    p.add_argument("--admin-key", help="require this key for control endpoints ([proxy] admin_key)")
    p.add_argument("--rewards", action="append", metavar="MODULE", help="reward module to load (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-proxy",
        description="OpenAI-compatible proxy that records agent calls as token-exact RL data, and trains on them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the proxy with its inference engine")
    _common(serve)
    _serving(serve)

    train = sub.add_parser("train", help="run proxy + episode runner + trainer on one machine (or Ray)")
    train.add_argument("config_file", nargs="?", metavar="CONFIG", help="run configuration (TOML)")
    _common(train)
    train.add_argument("--launcher", choices=["local", "ray"], default="local", help="where components run")
    train.add_argument("--address", help="Ray cluster address for --launcher ray (auto, ray://host:port)")
    train.add_argument("--db", help="store URL ([store] url)")
    train.add_argument("--device", choices=DEVICES, help="device for engine and trainer")
    train.add_argument(
        "--online",
        action="store_true",
        help="online RL: proxy + trainer, no runner; live traffic trains once rewarded ([online])",
    )

    engine = sub.add_parser("engine", help="serve the embedded engine over SGLang's native protocol")
    _common(engine)
    engine.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    engine.add_argument("--port", type=int, default=30000, help="TCP port (default 30000)")
    engine.add_argument("--model", help="Hugging Face id or local path ([engine] model)")
    engine.add_argument("--device", choices=DEVICES, help="device ([engine] device)")

    front = sub.add_parser("front", help="one base URL over several proxy replicas (sticky, health-checked)")
    _common(front)
    front.add_argument("--host", help="interface to bind ([front] host)")
    front.add_argument("--port", type=int, help="TCP port ([front] port)")
    front.add_argument("--replicas", metavar="URL,URL", help="proxy replica base URLs ([front] replicas)")

    evaluate = sub.add_parser("eval", help="evaluate the config's agent on held-out tasks (never trained on)")
    evaluate.add_argument("config_file", nargs="?", metavar="CONFIG", help="run configuration (TOML)")
    _common(evaluate)
    evaluate.add_argument("--model", help="model id, path or checkpoint to evaluate; `best` or `latest` of the run")
    evaluate.add_argument("--compare", metavar="OTHER", help="a second model: same tasks and seeds, paired difference")
    evaluate.add_argument("--split", help="dataset split ([eval] split, default eval)")
    evaluate.add_argument("--samples", type=int, help="episodes per task, for pass@k ([eval] samples)")
    evaluate.add_argument(
        "--temperature", type=float, help="forced sampling temperature, 0 greedy ([eval] temperature)"
    )
    evaluate.add_argument("--max-tasks", type=int, help="only the first N tasks ([eval] max_tasks)")
    evaluate.add_argument("--url", help="evaluate through this running proxy instead of starting one")
    evaluate.add_argument("--name", help="name of the evaluation (its sessions' groups are eval:NAME-...)")
    evaluate.add_argument("--out", help="report JSON (default: {trainer.run_dir}/evals/NAME.json)")
    evaluate.add_argument("--db", help="store URL ([store] url)")
    evaluate.add_argument("--device", choices=DEVICES, help="engine device ([engine] device)")

    export = sub.add_parser("export", help="write finished sessions as training samples")
    _common(export)
    export.add_argument("--db", help="store URL ([store] url)")
    export.add_argument("--out", required=True, help="output file (.jsonl or .parquet)")
    export.add_argument("--style", choices=["individual", "concat"], default="individual", help="sample layout")
    export.add_argument("--status", default="finished", help="sessions to export: finished, consumed or all")

    ui = sub.add_parser("ui", help="the web UI alone over a store: sessions, trees, groups, run curves")
    _common(ui)
    ui.add_argument("--db", help="store URL ([store] url)")
    ui.add_argument("--run-dir", help="run directory whose metrics.jsonl the run page plots ([trainer] run_dir)")
    ui.add_argument("--host", help="interface to bind ([proxy] host)")
    ui.add_argument("--port", type=int, default=8001, help="TCP port (default 8001)")
    ui.add_argument("--model", help="model whose tokenizer turns token ids into text ([engine] model)")
    ui.add_argument("--admin-key", help="require this key for the UI's data ([proxy] admin_key)")

    sessions = sub.add_parser("sessions", help="list sessions or show one as a tree")
    _common(sessions)
    sessions.add_argument("--db", help="store URL ([store] url)")
    sessions.add_argument("action", choices=["list", "show"], help="list, or show ID")
    sessions.add_argument("session_id", nargs="?", help="session to show")
    sessions.add_argument("--status", help="only sessions in this status (list)")
    sessions.add_argument("--limit", type=int, default=50, help="rows to list")
    sessions.add_argument("--tokens", action="store_true", help="show token ids (show)")

    rewards = sub.add_parser("rewards", help="list registered reward functions")
    _common(rewards)
    rewards.add_argument("action", choices=["list"], help="list")
    rewards.add_argument("--rewards", action="append", metavar="MODULE", help="reward module to load (repeatable)")
    return parser


def _config(args: argparse.Namespace, **options: Any) -> Config:
    extra = dict(options)
    if getattr(args, "rewards", None):
        extra["rewards.modules"] = args.rewards
    return load_config(args.config, args.overrides, **extra)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _config(
        args,
        **{
            "proxy.host": args.host,
            "proxy.port": args.port,
            "store.url": args.db,
            "engine.model": args.model,
            "engine.device": args.device,
            "proxy.admin_key": args.admin_key,
        },
    )
    _setup_logging(cfg.proxy.log_level)
    from proxy.serve import serve

    return serve(cfg)


def cmd_rewards(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from rewards.registry import REWARDS, DuplicateRewardError, load_modules

    try:
        load_modules(cfg.rewards.modules)
    except (DuplicateRewardError, ImportError, FileNotFoundError) as exc:
        print(f"areal-proxy: cannot load reward modules: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "kind", "defined in")
    for name, fn in sorted(REWARDS.items()):
        from rewards.registry import is_async

        table.add_row(name, "async" if is_async(fn) else "sync", f"{fn.__module__}.{fn.__qualname__}")
    Console().print(table)
    return 0


def cmd_sessions(args: argparse.Namespace) -> int:
    cfg = _config(args, **{"store.url": args.db})
    from proxy.sessions_cli import list_sessions, show_session

    if args.action == "list":
        return list_sessions(cfg, args.status, args.limit)
    if not args.session_id:
        print("areal-proxy sessions show: a session id is required", file=sys.stderr)
        return 2
    return show_session(cfg, args.session_id, args.tokens)


def cmd_ui(args: argparse.Namespace) -> int:
    options = {
        "store.url": args.db,
        "proxy.host": args.host,
        "engine.model": args.model,
        "proxy.admin_key": args.admin_key,
        "trainer.run_dir": args.run_dir,
    }
    cfg = _config(args, **options)
    _setup_logging(cfg.proxy.log_level)
    from pathlib import Path

    from proxy.ui.server import serve_ui

    return serve_ui(cfg, cfg.proxy.host, args.port, Path(cfg.trainer.run_dir).expanduser())


def cmd_export(args: argparse.Namespace) -> int:
    cfg = _config(args, **{"store.url": args.db})
    from trainer.export import export_file

    count = export_file(cfg, args.out, args.style, args.status)
    print(f"wrote {count} {args.style} samples to {args.out}")
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    cfg = _config(args, **{"engine.model": args.model, "engine.device": args.device})
    _setup_logging(cfg.proxy.log_level)
    from proxy.servers.engine import serve_engine

    return serve_engine(cfg, args.host or "127.0.0.1", args.port)


def cmd_front(args: argparse.Namespace) -> int:
    replicas = [u.strip() for u in args.replicas.split(",") if u.strip()] if args.replicas else None
    cfg = _config(args, **{"front.host": args.host, "front.port": args.port, "front.replicas": replicas})
    _setup_logging(cfg.proxy.log_level)
    from proxy.servers.front import serve_front

    return serve_front(cfg)


def cmd_eval(args: argparse.Namespace) -> int:
    options = {
        "store.url": args.db,
        "engine.device": args.device,
        "eval.split": args.split,
        "eval.samples": args.samples,
        "eval.temperature": args.temperature,
        "eval.max_tasks": args.max_tasks,
    }
    cfg = load_config(args.config_file or args.config, args.overrides, **options)
    _setup_logging("warning")
    from evaluation.cli import print_result, run_eval

    try:
        result, path = run_eval(cfg, model=args.model, compare=args.compare, url=args.url, name=args.name, out=args.out)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"areal-proxy eval: {exc}", file=sys.stderr)
        return 2
    print_result(result, path)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    path = args.config_file or args.config
    cfg = load_config(path, args.overrides, **{"store.url": args.db, "engine.device": args.device})
    if args.device:
        cfg.trainer.device = args.device
    _setup_logging(cfg.proxy.log_level)
    if args.launcher == "ray":
        if args.online:
            raise SystemExit("train --online runs with --launcher local (the proxy and trainer on this machine)")
        from trainer.launch.ray import launch

        return launch(cfg, path, args.address)
    from trainer.launch.local import launch

    return launch(cfg, path, online=args.online)


COMMANDS = {
    "serve": cmd_serve,
    "train": cmd_train,
    "engine": cmd_engine,
    "front": cmd_front,
    "eval": cmd_eval,
    "export": cmd_export,
    "sessions": cmd_sessions,
    "ui": cmd_ui,
    "rewards": cmd_rewards,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"areal-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
