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
