"""Admin and session keys: a session key reaches only its own session; control needs the admin key."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import run_server

ADMIN = "admin-secret"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("locked")
    with run_server(tmp, f"sqlite:///{tmp}/a.db", admin_key=ADMIN) as server:
        yield server


def post(server, path, key=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, headers=headers, timeout=120, **kw)


def test_control_endpoints_need_the_admin_key(locked):
    assert post(locked, "/sessions", json={}).status_code == 401
    assert post(locked, "/sessions", key="wrong", json={}).status_code == 401
    created = post(locked, "/sessions", key=ADMIN, json={})
    assert created.status_code == 201
    session_key = created.json()["api_key"]
    r = post(locked, "/sessions", key=session_key, json={})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    sid = created.json()["session_id"]
    assert post(locked, f"/sessions/{sid}/finish", key=session_key, json={"reward": 1}).status_code == 403
    assert post(locked, "/weights", json={"path": "x", "version": 1}).status_code == 401


def test_model_calls_need_a_session_or_admin_key(locked):
    assert post(locked, "/v1/chat/completions", json=BODY).status_code == 401
    assert post(locked, "/v1/chat/completions", key="anything", json=BODY).status_code == 401
    assert post(locked, "/v1/chat/completions", key=ADMIN, json=BODY).status_code == 200  # automatic session


def test_session_key_only_reaches_its_own_session(locked):
    a = post(locked, "/sessions", key=ADMIN, json={}).json()
    b = post(locked, "/sessions", key=ADMIN, json={}).json()
    # own session, by key alone or by path + key
    assert post(locked, "/v1/chat/completions", key=a["api_key"], json=BODY).status_code == 200
    assert (
        post(locked, f"/sessions/{a['session_id']}/v1/chat/completions", key=a["api_key"], json=BODY).status_code == 200
    )
    # another session's path with this key
    r = post(locked, f"/sessions/{b['session_id']}/v1/chat/completions", key=a["api_key"], json=BODY)
    assert r.status_code == 403
    # a path without any key
    assert post(locked, f"/sessions/{b['session_id']}/v1/chat/completions", json=BODY).status_code == 401
    # reading: own key yes, other key no
    headers = {"Authorization": f"Bearer {a['api_key']}"}
    assert httpx.get(f"{locked.url}/sessions/{a['session_id']}", headers=headers, timeout=30).status_code == 200
    assert httpx.get(f"{locked.url}/sessions/{b['session_id']}", headers=headers, timeout=30).status_code == 403
    tree = httpx.get(f"{locked.url}/sessions/{a['session_id']}", headers=headers, timeout=30).json()
    assert len(tree["completions"]) == 2
    assert not httpx.get(
        f"{locked.url}/sessions/{b['session_id']}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    ).json()["completions"]


def test_second_proxy_on_the_same_sqlite_file_is_refused(locked, tmp_path):
    import subprocess
    import sys

    db = locked.db_url
    r = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--port", "0", "--db", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "PostgreSQL" in r.stderr and "another areal-proxy process" in r.stderr


def test_a_session_key_cannot_read_its_answer(locked):
    """The policy being trained holds its session key; a tool-using policy could otherwise fetch the
    reference answer it is graded on, the reward function or the task's metadata."""
    created = post(
        locked, "/sessions", key=ADMIN, json={"reference": "42", "reward_fn": "math_exact", "metadata": {"hint": "42"}}
    ).json()
    url = f"{locked.url}/sessions/{created['session_id']}"
    own = httpx.get(url, headers={"Authorization": f"Bearer {created['api_key']}"}, timeout=30).json()
    assert not {"reference", "reward_fn", "metadata"} & set(own), own
    admin = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    assert admin["reference"] == "42" and admin["reward_fn"] == "math_exact" and admin["metadata"] == {"hint": "42"}


@pytest.mark.parametrize("command", ["serve", "engine", "front"])
def test_listening_off_loopback_needs_an_admin_key(command, tmp_path):
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "proxy.cli", command, "--host", "0.0.0.0", "--port", "0"]
    args += ["--db", f"sqlite:///{tmp_path}/a.db"] if command == "serve" else []
    args += ["--replicas", "http://127.0.0.1:9"] if command == "front" else []
    env = {k: v for k, v in os.environ.items() if k != "AREAL_ADMIN_KEY"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "without an admin key" in r.stderr and "AREAL_ADMIN_KEY" in r.stderr and "127.0.0.1" in r.stderr
