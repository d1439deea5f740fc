"""chatapp in front of a server as a benchmark peer: the `chatapp` peer's requests through the remote engine.

The path of the chat screen and `chatapp ask` with `--backend URL`: the peer is the `chatapp`
peer (peers.py: its `ask`, `prepare` and `settle`) whose engine is `connect_remote_engine`
(engine/remote.py): prompts go as token ids to the server's `/completion`; TTFT runs from
sending the request to the first streamed text, measured here; the computed tokens are the
prompt less what the server says it reused (`timings.cache_n`).

- `remote:URL` (e.g. `remote:http://gpu-box:8080`): a server already running, llama-server or
  another `chatapp serve`, its API key from $CHATAPP_BACKEND_KEY; named `remote:HOST:PORT` in
  the reports. The bench did not start it and cannot restart it: workload E's restart only
  reconnects, and the run's record says so (`restart`). Nor does each workload find it fresh,
  as the other peers' folders are: its cache keeps what earlier workloads and peers left.
- `chatapp-remote`: a `chatapp serve` the bench starts on the peer's folder as it starts the
  `chatapp-serve` peer (serve_peer.py: the same settings; restarted with SIGTERM, which writes
  the cache, for E), asked through the remote engine: chatapp in front of chatapp, the whole
  path measured.

`+warm` after either (`chatapp-remote+warm`, `remote:URL+warm`) adds the app's warm-ahead as
`chatapp+warm` does, on workloads whose requests carry drafts (C). `settle` waits for a
chatapp serve to store the answer (`POST /chatapp/flush`), as the in-process peer waits for its
engine; llama-server stores nothing after an answer, so there it waits for nothing.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from chatapp.benchmark.peers import ChatappPeer, ChatappWarmAheadPeer, Peer, PeerSettings
from chatapp.benchmark.serve_peer import ChatappServePeer, flush_server
from chatapp.engine.contract import EngineClient
from chatapp.engine.opening import RemoteConfig, connect_remote_engine
from chatapp.services.prompt_plan import builder_of

ENV_BACKEND_KEY = "CHATAPP_BACKEND_KEY"
LOOPBACK_PEER = "chatapp-remote"
URL_PREFIX = "remote:"
WARM_SUFFIX = "+warm"
FLUSH_TIMEOUT_S = 600.0  # storing an answer's blocks waits for the recompute before it
SPEC_EXAMPLE = "remote:http://127.0.0.1:8080"


class PeerSpecError(ValueError):
    """A `remote:URL` peer whose URL is not a server's address."""


class _Server(Protocol):
    """Where the remote engine connects, and what the peer asks of the server besides answers."""

    @property
    def base_url(self) -> str: ...

    @property
    def api_key(self) -> str | None: ...

    def settle(self) -> None: ...

    def close(self) -> None: ...

    def peak_rss_bytes(self) -> int | None: ...


class _LoopbackServer(ChatappServePeer):
    """The `chatapp serve` behind `chatapp-remote`: started, stopped and restarted as the `chatapp-serve` peer."""

    name = "chatapp serve (chatapp-remote)"
    api_key: str | None = None


class _ServerElsewhere:
    """A server the bench did not start: reached at its URL, never stopped here."""

    def __init__(self, url: str) -> None:
        self.base_url = RemoteConfig(url).base_url
        self.api_key = os.environ.get(ENV_BACKEND_KEY) or None
        self._flushes = True  # until the server says it has no /chatapp/flush (llama-server)

    def settle(self) -> None:
        if self._flushes:
            self._flushes = flush_server(self.base_url, self.api_key, FLUSH_TIMEOUT_S, self.base_url)

    def close(self) -> None:
        """Nothing: the server runs on."""

    def peak_rss_bytes(self) -> int | None:
        return None  # another process, perhaps on another machine


def _connect(server: _Server) -> EngineClient:
    """The remote engine; ChatappError where the server builds its own prompts (the workloads are token ids)."""
    engine = connect_remote_engine(RemoteConfig(server.base_url, api_key=server.api_key))
    try:
        builder_of(engine)
    except BaseException:
        engine.close()
        raise
    return engine


class RemotePeer(ChatappPeer):
    """The `chatapp` peer with the remote engine in front of `server`."""

    def __init__(self, name: str, server: _Server, settings: PeerSettings, folder: Path) -> None:
        self.name = name
        self.server = server
        super().__init__(settings, folder)

    def open_engine(self, settings: PeerSettings, folder: Path) -> EngineClient:
        return _connect(self.server)

    def settle(self) -> None:
        super().settle()  # the remote engine's flush_cache: nothing to wait for here
        self.server.settle()  # the server's: the answer recomputed and stored

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.server.close()

    def peak_rss_bytes(self) -> int | None:
        """The server's peak RSS, when the bench started it (the runner adds it to this process's)."""
        return self.server.peak_rss_bytes()


class RemoteWarmAheadPeer(RemotePeer, ChatappWarmAheadPeer):
    """The same with `chatapp+warm`'s warm-ahead: the persona and document computed before the question."""


@dataclass(frozen=True)
class RemotePeerFactory:
    """Makes remote peers: on a server at `url`, or (`url` None) on a `chatapp serve` started on the peer's folder."""

    name: str
    url: str | None = None
    warm: bool = False

    @property
    def drafts_only(self) -> bool:
        """The warm-ahead variant runs only on workloads whose requests say how the app builds them."""
        return self.warm

    @property
    def restart_note(self) -> str | None:
        """What a restart (workload E) does when it is not a restart of the server."""
        if self.url is None:
            return None
        return "reconnected only: the server was not restarted (the bench did not start it)"

    def __call__(self, settings: PeerSettings, folder: Path) -> Peer:
        server: _Server = _LoopbackServer(settings, folder) if self.url is None else _ServerElsewhere(self.url)
        peer_class = RemoteWarmAheadPeer if self.warm else RemotePeer
        try:
            return peer_class(self.name, server, settings, folder)
        except BaseException:
            server.close()
            raise

    def check(self) -> None:
        """Reach a `remote:URL` server once before the run: RemoteEngineError, one line, when it cannot be used."""
        if self.url is not None:
            _connect(_ServerElsewhere(self.url)).close()


def remote_peer_factory(spec: str) -> RemotePeerFactory | None:
    """The factory a `--peers` item names (`chatapp-remote`, `remote:URL`, either `+warm`); None for other peers.

    PeerSpecError, one line naming the fix, when a `remote:` item's URL is not a server's address.
    """
    base, warm = (spec.removesuffix(WARM_SUFFIX), True) if spec.endswith(WARM_SUFFIX) else (spec, False)
    if base == LOOPBACK_PEER:
        return RemotePeerFactory(spec, warm=warm)
    if not base.startswith(URL_PREFIX):
        return None
    url = base.removeprefix(URL_PREFIX)
    address = urllib.parse.urlsplit(RemoteConfig(url).base_url)
    if address.scheme not in ("http", "https") or not address.hostname or not _valid_port(address):
        raise PeerSpecError(
            f"--peers {spec}: {url!r} is not a server's address; give its URL after 'remote:', e.g. {SPEC_EXAMPLE}"
        )
    where = address.netloc.rpartition("@")[2] + address.path
    return RemotePeerFactory(f"{URL_PREFIX}{where}{WARM_SUFFIX if warm else ''}", url=url, warm=warm)


def _valid_port(address: urllib.parse.SplitResult) -> bool:
    try:
        _ = address.port  # raises for a port that is not a number or out of range
    except ValueError:
        return False
    return True
