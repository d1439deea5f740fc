"""`--peers` items for chatapp in front of a server: `chatapp-remote`, `remote:URL`, either `+warm` (no model)."""

from __future__ import annotations

import pytest

from chatapp.benchmark.remote_peer import SPEC_EXAMPLE, PeerSpecError, RemotePeerFactory, remote_peer_factory


def test_the_loopback_peer_and_its_warm_ahead_variant() -> None:
    assert remote_peer_factory("chatapp-remote") == RemotePeerFactory("chatapp-remote")
    warm = remote_peer_factory("chatapp-remote+warm")
    assert warm == RemotePeerFactory("chatapp-remote+warm", warm=True)
    assert warm.drafts_only
    assert warm.restart_note is None  # the bench started the server: it restarts it


def test_a_url_peer_is_named_by_its_host_and_port_and_cannot_be_restarted() -> None:
    peer = remote_peer_factory("remote:http://127.0.0.1:8080")
    assert peer == RemotePeerFactory("remote:127.0.0.1:8080", url="http://127.0.0.1:8080")
    assert not peer.drafts_only
    assert peer.restart_note is not None
    assert "not restarted" in peer.restart_note
    # Credentials and an OpenAI-style /v1 stay out of the name; +warm adds the warm-ahead.
    warm = remote_peer_factory("remote:https://user:pw@gpu-box:8443/v1/+warm")
    assert warm is not None
    assert (warm.name, warm.url, warm.warm) == ("remote:gpu-box:8443+warm", "https://user:pw@gpu-box:8443/v1/", True)


@pytest.mark.parametrize("spec", ["remote:", "remote:localhost:8080", "remote:ftp://host", "remote:http://host:99999"])
def test_a_url_that_is_not_a_server_address_is_refused_with_an_example(spec: str) -> None:
    with pytest.raises(PeerSpecError) as raised:
        remote_peer_factory(spec)
    message = str(raised.value)
    assert "\n" not in message
    assert spec in message
    assert SPEC_EXAMPLE in message


def test_other_peers_are_not_remote() -> None:
    assert remote_peer_factory("chatapp") is None
    assert remote_peer_factory("chatapp-serve") is None
    assert remote_peer_factory("remote") is None
