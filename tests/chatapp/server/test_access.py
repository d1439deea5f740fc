"""Web pages cannot use a server on this machine: a Host that is not a loopback name (DNS rebinding) and an
Origin of another site are refused before any route, as JSON and as a text/plain "simple" request; local
clients, pages on this machine and allowed origins are answered, with CORS headers for pages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from chatapp.cli import access_policy, build_parser
from chatapp.errors import SettingsError
from chatapp.server.access import ORIGINS_ENV, AccessPolicy, host_name
from tests.server_support import RunningServer


@pytest.fixture
def chat(server: RunningServer) -> dict[str, object]:
    return {"model": server.model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


@pytest.fixture
def allowing(server: RunningServer) -> Iterator[None]:
    """The running server, with https://app.example.com and the name chatapp.lan allowed for one test."""
    kept = server.context.access
    server.context.access = replace(
        kept, allowed_origins=("https://app.example.com",), allowed_hosts=frozenset({"chatapp.lan"})
    )
    yield
    server.context.access = kept


def test_a_host_that_is_not_this_machine_is_refused_as_dns_rebinding_would_send_it(
    http: httpx.Client, chat: dict[str, object]
) -> None:
    for path in ("/v1/models", "/metrics", "/health"):
        response = http.get(path, headers={"Host": "attacker.example"})
        assert response.status_code == 403
        assert "--allowed-hosts attacker.example" in response.text
    refused = http.post("/v1/chat/completions", json=chat, headers={"Host": "attacker.example:8080"})
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"


def test_local_names_are_answered_on_any_port(http: httpx.Client, server: RunningServer) -> None:
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]:9", "LOCALHOST."):
        assert http.get("/v1/models", headers={"Host": host}).status_code == 200, host


def test_a_page_of_another_site_is_refused_as_json_and_as_a_simple_text_request(
    http: httpx.Client, chat: dict[str, object]
) -> None:
    evil = {"Origin": "http://evil.example"}
    as_json = http.post("/v1/chat/completions", json=chat, headers=evil)
    assert as_json.status_code == 403
    assert "--allowed-origins http://evil.example" in as_json.text
    assert "access-control-allow-origin" not in as_json.headers
    simple = http.post("/api/chat", content=json.dumps(chat), headers={**evil, "Content-Type": "text/plain"})
    assert simple.status_code == 403
    preflight = http.options("/v1/messages", headers={**evil, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403
    assert "access-control-allow-origin" not in preflight.headers
    assert http.get("/v1/models", headers={"Origin": "null"}).status_code == 403  # a file:// page, a sandbox
    assert http.get("/v1/models", headers={"Origin": "http://[::1"}).status_code == 403  # malformed: not a 500


def test_a_page_on_this_machine_is_answered_and_may_read_the_answer(
    http: httpx.Client, chat: dict[str, object]
) -> None:
    page = "http://localhost:5173"
    preflight = http.options(
        "/v1/chat/completions",
        headers={
            "Origin": page,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == page
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    answered = http.post("/v1/chat/completions", json=chat, headers={"Origin": page})
    assert answered.status_code == 200
    assert answered.headers["access-control-allow-origin"] == page
    local = http.get("/v1/models", headers={"Origin": "http://127.0.0.1:8000"})
    assert local.status_code == 200
    editor = http.get("/v1/models", headers={"Origin": "vscode-webview://1a2b3c"})  # an editor's assistant panel
    assert editor.status_code == 200


def test_a_local_client_sends_no_origin_and_gets_no_cors_headers(http: httpx.Client) -> None:
    response = http.get("/v1/models")
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers


@pytest.mark.usefixtures("allowing")
def test_allowed_origins_and_hosts_are_answered(http: httpx.Client, chat: dict[str, object]) -> None:
    allowed = http.post("/v1/chat/completions", json=chat, headers={"Origin": "https://app.example.com"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
    assert http.get("/v1/models", headers={"Origin": "https://other.example.com"}).status_code == 403
    assert http.get("/v1/models", headers={"Host": "chatapp.lan:8080"}).status_code == 200
    assert http.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 403


def test_the_key_still_decides_after_the_access_checks(http: httpx.Client, server: RunningServer) -> None:
    server.context.api_key = "k"
    try:
        page = {"Origin": "http://localhost:3000"}
        assert http.get("/v1/models", headers=page).status_code == 401
        preflight = http.options("/v1/models", headers={**page, "Access-Control-Request-Method": "GET"})
        assert preflight.status_code == 204  # a browser asks before it sends the key
        assert http.get("/v1/models", headers={**page, "Authorization": "Bearer k"}).status_code == 200
    finally:
        server.context.api_key = None


def test_bound_beyond_this_machine_the_host_is_not_checked_but_the_origin_is() -> None:
    policy = AccessPolicy.for_address(False)
    assert policy.host_refusal("chatapp.lan:8080") is None
    assert not policy.origin_allowed("http://evil.example")
    assert policy.origin_allowed("http://[::1]:8080")
    assert AccessPolicy.for_address(False, ["chatapp.lan"]).host_refusal("other.lan") is not None
    wildcard = AccessPolicy.for_address(True, allowed_origins=["https://*.example.com"])
    assert wildcard.origin_allowed("https://app.example.com")
    assert not wildcard.origin_allowed("https://example.org")
    assert AccessPolicy.for_address(True, allowed_origins=["*"]).origin_allowed("https://any.example:8443")
    ipv6 = AccessPolicy.for_address(True, allowed_origins=["http://[fe80::1]:3000"])
    assert ipv6.origin_allowed("http://[fe80::1]:3000")
    assert not ipv6.origin_allowed("http://f:3000")  # brackets are the address's, not a character class
    assert not wildcard.origin_allowed("https://evil.com/.example.com")
    assert AccessPolicy.for_address(True, ["[fe80::1]"]).host_refusal("[fe80::1]:8080") is None
    assert host_name("[::1]:8080") == "::1"
    assert host_name("127.0.0.1:80") == "127.0.0.1"


def test_the_flags_and_the_environment_make_the_policy_and_refuse_what_is_not_a_name_or_origin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    monkeypatch.setenv(ORIGINS_ENV, "https://b.example")
    args = parser.parse_args(
        ["serve", "--allowed-origins", "https://a.example,http://*.lan", "--allowed-hosts", "chatapp.lan"]
    )
    policy = access_policy(args)
    assert policy.allowed_origins == ("https://a.example", "http://*.lan", "https://b.example")
    assert policy.allowed_hosts == frozenset({"chatapp.lan"})
    monkeypatch.delenv(ORIGINS_ENV)
    for wrong, flag in (("app.example.com/path", "--allowed-origins"), ("http://x/y", "--allowed-origins")):
        with pytest.raises(SettingsError, match=f"{flag} .* is not an origin"):
            access_policy(parser.parse_args(["serve", flag, wrong]))
    for wrong in ("chatapp.lan:8080", "*.lan"):
        with pytest.raises(SettingsError, match="is not a host name"):
            access_policy(parser.parse_args(["serve", "--allowed-hosts", wrong]))
    anything = access_policy(
        parser.parse_args(["serve", "--allowed-hosts", "*", "--allowed-origins", "https://a.example/"])
    )
    assert anything.host_refusal("whatever.example") is None
    assert anything.allowed_origins == ("https://a.example",)
