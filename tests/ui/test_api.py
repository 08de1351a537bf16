"""The UI's JSON over a real `areal-proxy ui` on SQLite and on PostgreSQL: a bad parameter is a 400
in OpenAI's shape naming it, an unknown id a 404, hostile values (NUL characters, overflowing or
forged cursors, path tricks) never a server error; pages of the HTTP API walk the store once; the
run endpoint reads metrics.jsonl from an offset."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import nullcontext

import httpx
import pytest

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import completions
from proxy.store.sessions import insert_sessions
from proxy.store.tokens import pack_floats, pack_ints
from tests.conftest import cli_process, fresh_pg_database
from trainer.metrics import MetricsSink


def fill(url: str) -> list[str]:
    """Twelve sessions in four groups of three, one of them with a turn; their ids."""
    rows = [
        {
            "id": f"sess_{i:04d}",
            "key_hash": f"hash{i}",
            "task_id": f"t{i // 3}",
            "group_id": f"g/{i // 3}",  # a slash in a group id: the path still finds it
            "metadata": {},
            "status": "finished" if i % 4 else "failed",
            "auto": False,
            "eval": i == 11,
            "reward": None if i % 4 == 0 else float(i % 3),
            "num_completions": 1 if i == 1 else 0,
            "created_at": 100.0 + i // 3,
            "updated_at": 100.0 + i,
        }
        for i in range(12)
    ]
    turn = {
        "id": "chatcmpl-1",
        "session_id": "sess_0001",
        "response_id": "chatcmpl-1",
        "chain_hash": "h",
        "request": {"messages": [{"role": "user", "content": "hi"}], "num_messages": 1},
        "response": {"role": "assistant", "content": "Hello"},
        "prompt_ids": pack_ints([1, 2, 3]),
        "prompt_len": 3,
        "output_ids": pack_ints([19556, 2]),
        "output_logprobs": pack_floats([-0.5, -0.1]),
        "output_versions": pack_ints([0, 0]),
        "finish_reason": "stop",
        "reward": 1.0,
        "ret": 1.0,
        "created_at": 101.0,
    }
    db = Database(StoreConfig(url=url))
    db.transaction(lambda c: (insert_sessions(c, rows), c.execute(completions.insert(), [turn])))
    db.close()
    return [r["id"] for r in rows]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def ui(request, tmp_path_factory) -> Iterator[tuple[str, list[str], object]]:
    tmp = tmp_path_factory.mktemp(f"ui-api-{request.param}")
    store = fresh_pg_database() if request.param == "postgres" else nullcontext(f"sqlite:///{tmp}/areal.db")
    with store as url:
        ids = fill(url)
        with cli_process(tmp, "ui", "--db", url, "--run-dir", str(tmp / "run")) as (base, _, _):
            yield base, ids, tmp / "run"


def cursor(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/ui/api/sessions?limit=0", "limit"),
        ("/ui/api/sessions?limit=501", "limit"),
        ("/ui/api/sessions?status=sleeping", "status"),
        ("/ui/api/sessions?eval=maybe", "eval"),
        ("/ui/api/sessions?reward_min=nan", "reward_min"),
        ("/ui/api/sessions?reward_min=2&reward_max=1", "reward_min"),
        ("/ui/api/sessions?since=200&until=100", "since"),
        ("/ui/api/sessions?version_min=-1", "version_min"),
        ("/ui/api/sessions?task=a%00b", "task"),
        ("/ui/api/sessions?older_than=bm90IGpzb24", "older_than"),
        (f"/ui/api/sessions?older_than={cursor([1e400, 'x'])}", "older_than"),
        (f"/ui/api/sessions?older_than={cursor([10**400, 'x'])}", "older_than"),
        (f"/ui/api/sessions?newer_than={cursor([1.0, 'a' + chr(0)])}", "newer_than"),
        (f"/ui/api/sessions?older_than={cursor([1.0, 'a'])}&newer_than={cursor([2.0, 'b'])}", "newer_than"),
        ("/ui/api/run?offset=-1", "offset"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(ui, path, param):
    base, _, _ = ui
    r = httpx.get(base + path, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


@pytest.mark.parametrize(
    "path",
    [
        "/ui/api/sessions/sess_none",
        "/ui/api/sessions/sess_0001/prompts/chatcmpl-none",
        "/ui/api/groups/no-such-group",
        "/ui/static/..%2Fstate.py",
        "/ui/static/.hidden.js",
        "/ui/static/routes.py",
        "/ui/api/nothing",
    ],
)
def test_unknown_things_are_404s(ui, path):
    base, _, _ = ui
    r = httpx.get(base + path, timeout=30)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("path", ["/ui/api/sessions/a%00b", "/ui/api/groups/g%00", "/ui/api/sessions/x/prompts/%00"])
def test_a_nul_in_a_path_is_refused_not_a_server_error(ui, path):
    base, _, _ = ui
    r = httpx.get(base + path, timeout=30)
    assert r.status_code == 400, r.text


def test_pages_walk_the_store_once_and_filters_apply(ui):
    base, ids, _ = ui
    seen, older = [], None
    while True:
        params = {"limit": 5, **({"older_than": older} if older else {})}
        page = httpx.get(f"{base}/ui/api/sessions", params=params, timeout=30).json()
        assert page["total"] == 12 and not page["total_capped"]
        seen += [s["session_id"] for s in page["data"]]
        if not page["older"]:
            break
        older = page["older"]
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    assert all("key_hash" not in s for s in page["data"])
    failed = httpx.get(f"{base}/ui/api/sessions", params={"status": "failed"}, timeout=30).json()
    assert sorted(s["session_id"] for s in failed["data"]) == ["sess_0000", "sess_0004", "sess_0008"]
    group = httpx.get(f"{base}/ui/api/groups/g/1", timeout=30).json()
    assert [s["session_id"] for s in group["sessions"]] == ["sess_0003", "sess_0004", "sess_0005"]


def test_a_session_comes_with_its_tokens_as_text(ui):
    base, _, _ = ui
    view = httpx.get(f"{base}/ui/api/sessions/sess_0001", timeout=60).json()
    (node,) = view["completions"]
    assert node["output_ids"] == [19556, 2] and node["output_pieces"] == ["Hello", "<|im_end|>"]
    assert node["reward"] == 1.0 and node["return"] == 1.0 and view["tokens_decoded"]
    prompt = httpx.get(f"{base}/ui/api/sessions/sess_0001/prompts/chatcmpl-1", timeout=60).json()
    assert prompt["ids"] == [1, 2, 3] and prompt["inherited"] == 0 and "divergence" not in prompt


def test_the_run_endpoint_reads_from_an_offset(ui):
    base, _, run_dir = ui
    empty = httpx.get(f"{base}/ui/api/run", timeout=30).json()
    assert empty["rows"] == [] and not empty["exists"]
    sink = MetricsSink(run_dir, tensorboard=False)
    sink.log(1, {"reward_mean": 0.25})
    first = httpx.get(f"{base}/ui/api/run", timeout=30).json()
    assert [r["reward_mean"] for r in first["rows"]] == [0.25] and first["exists"]
    sink.log(2, {"reward_mean": 0.5})
    sink.close()
    second = httpx.get(f"{base}/ui/api/run", params={"offset": first["offset"]}, timeout=30).json()
    assert [r["step"] for r in second["rows"]] == [2]
