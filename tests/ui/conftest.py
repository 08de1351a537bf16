"""A store filled by a short real run, the servers that show it, and a real headless Chromium.

`recorded_run` trains the Anthropic-client calculator example (a tool-calling agent) for two tiny
steps with an evaluation at every step: the store holds tool-calling episodes in groups, trained
and failed sessions, evaluation sessions, and the run directory real training and evaluation
rows. `ui_proxy` serves that store with an admin key (`areal-proxy serve`, the UI at /ui) under a
chat template with a turn counter in its system header, which re-renders the history every turn,
and records one more group through the OpenAI client: three sessions with chosen rewards, one of
which branches after its first turn (each branch a new token sequence linked to that turn).
`standalone_ui` is `areal-proxy ui` over the same store and run directory.

The browser is Debian's chromium (`/usr/bin/chromium`, or AREAL_CHROMIUM), driven by Playwright;
a missing browser fails these tests rather than skipping them. Each test's page is screenshotted
into the artifacts directory (AREAL_TEST_ARTIFACTS, default tests/ui/artifacts/, gitignored)
and must log no console error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, Server, cli_process, run_server
from trainer.launch.processes import log_tail

ADMIN_KEY = "ui-test-admin-key"
KEY_STORAGE = "areal-proxy.admin-key"
CHROMIUM = Path(os.environ.get("AREAL_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(os.environ.get("AREAL_TEST_ARTIFACTS") or REPO / "tests" / "ui" / "artifacts")

# SmolLM2's template with a turn counter in a system header of its own: every request renders the
# earlier turns under a different header, so no turn's prompt extends its parent's tokens.
TURN_COUNTER_TEMPLATE = (
    "{{ '<|im_start|>system\\nturn ' ~ (messages|length) ~ '<|im_end|>\\n' }}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GROUP = "ui-group"
GROUP_REWARDS = {"branched": 1.0, "partial": 0.3, "wrong": 0.0}


@dataclass
class RecordedRun:
    tmp: Path
    db_url: str
    run_dir: Path


@dataclass
class UIProxy:
    server: Server
    run: RecordedRun
    group: dict[str, str] = field(default_factory=dict)  # role in GROUP_REWARDS -> session id
    keys: list[str] = field(default_factory=list)  # the session keys handed out for that group

    def api(self, path: str, **params: object) -> dict:
        r = httpx.get(self.server.url + path, params=params, headers=self.server.headers(), timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    tmp = tmp_path_factory.mktemp("ui-run")
    run = RecordedRun(tmp=tmp, db_url=f"sqlite:///{tmp}/areal.db", run_dir=tmp / "run")
    overrides = {
        "trainer.max_steps": 2,
        "trainer.batch.size": 4,
        "rollout.group_size": 2,
        "trainer.batch.skip_zero_variance": "false",  # both steps train and push, whatever the rewards
        "trainer.checkpoint.every": 1000,
        "trainer.run_dir": str(run.run_dir),
        "store.url": run.db_url,
        "eval.every_steps": 1,
        "eval.max_tasks": 4,
        "eval.temperature": 0,
        "eval.keep_best": "false",  # no checkpoint per evaluation (1.6 GB each): the pages show none
    }
    args = [sys.executable, "-m", "proxy.cli", "train", "examples/claude_style_messages/config.toml"]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, "\n".join(
        [(proc.stdout + proc.stderr)[-3000:], "trainer.log:", log_tail(run.run_dir / "trainer.log", 4000)]
        + ["proxy.log:", log_tail(run.run_dir / "proxy.log", 2000)]
    )
    return run


def _chat(client, messages: list[dict]) -> tuple[str, str]:
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=1.0)
    return r.id, r.choices[0].message.content or ""


def record_group(server: Server) -> tuple[dict[str, str], list[str]]:
    """Three sessions of one group through the OpenAI client; the first branches after its first
    turn. Rewards: the branch that went on gets a turn reward, each session an episode reward."""
    import openai

    made = server.post("/sessions", json={"count": 3, "group_id": GROUP, "task_id": "two-plus-two", "reference": "4"})
    assert made.status_code == 201, made.text
    sessions = dict(zip(GROUP_REWARDS, made.json()["data"]))
    ids = {role: s["session_id"] for role, s in sessions.items()}
    for role, s in sessions.items():
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        question = [{"role": "user", "content": "What is 2 + 2?"}]
        root, answer = _chat(client, question)
        if role == "branched":
            asked = [*question, {"role": "assistant", "content": answer}]
            kept, _ = _chat(client, [*asked, {"role": "user", "content": "Are you sure?"}])
            _chat(client, [*asked, {"role": "user", "content": "Say it in words."}])
            r = server.post(f"/sessions/{s['session_id']}/reward", json={"reward": 0.5, "completion_id": kept})
            assert r.status_code == 200, r.text
        r = server.post(f"/sessions/{s['session_id']}/finish", json={"reward": GROUP_REWARDS[role]})
        assert r.status_code == 200, r.text
    return ids, [s["api_key"] for s in sessions.values()]


@pytest.fixture(scope="module")
def ui_proxy(recorded_run: RecordedRun) -> Iterator[UIProxy]:
    template = recorded_run.tmp / "turn_counter.jinja"
    template.write_text(TURN_COUNTER_TEMPLATE)
    args = ["--set", f"trainer.run_dir={recorded_run.run_dir}", "--set", f"engine.chat_template={template}"]
    with run_server(recorded_run.tmp, recorded_run.db_url, *args, admin_key=ADMIN_KEY) as server:
        ids, keys = record_group(server)
        yield UIProxy(server=server, run=recorded_run, group=ids, keys=keys)


@pytest.fixture(scope="module")
def standalone_ui(recorded_run: RecordedRun, ui_proxy: UIProxy) -> Iterator[str]:
    """`areal-proxy ui` beside the running proxy, over the same store (read while it is owned)."""
    args = ["--db", recorded_run.db_url, "--run-dir", str(recorded_run.run_dir)]
    with cli_process(recorded_run.tmp, "ui", *args) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def browser():
    # Module scope: Playwright's sync API runs an event loop on this thread while it is open, and
    # tests elsewhere that call asyncio.run() must not find it running.
    if not CHROMIUM.is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: install Debian's (apt-get install chromium) or set AREAL_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield chromium
        chromium.close()


class Page:
    """A browser tab that records console errors and failed page scripts."""

    def __init__(self, browser, name: str, admin_key: str | None) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        if admin_key:  # as if the reader had typed it into the key dialog earlier in this tab
            self.context.add_init_script(f"sessionStorage.setItem({KEY_STORAGE!r}, {admin_key!r})")
        self.tab = self.context.new_page()
        self.tab.set_default_timeout(60_000)  # a busy 2-core machine; waits end as soon as the page is there
        self.name = name
        self.errors: list[str] = []
        self.tab.on("console", lambda m: m.type == "error" and self.errors.append(f"{m.text} ({m.location})"))
        self.tab.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def screenshot(self, label: str = "") -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}{'-' + label if label else ''}.png"
        self.tab.screenshot(path=str(path), full_page=True)
        return path


def _page(browser, request: pytest.FixtureRequest, admin_key: str | None) -> Iterator[Page]:
    page = Page(browser, request.node.name.replace("/", "_"), admin_key)
    try:
        yield page
        page.screenshot()
        assert not page.errors, f"console errors: {page.errors}"
    finally:
        page.context.close()


@pytest.fixture
def page(browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A tab holding the admin key, as after the reader entered it."""
    yield from _page(browser, request, ADMIN_KEY)


@pytest.fixture
def keyless_page(browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh tab that has never been given the key."""
    yield from _page(browser, request, None)
