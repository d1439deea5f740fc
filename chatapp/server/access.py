"""Which web pages may use the server: DNS rebinding and cross-site requests refused before any route.

A server on 127.0.0.1 without a key is reachable from every web page the user opens: by DNS
rebinding (a name that resolves to the attacker, then to 127.0.0.1, after which the page is
same-origin with the server: its requests carry that name as Host) and by cross-site "simple"
requests (a POST with `Content-Type: text/plain` needs no CORS preflight, and the browser delivers
it). Bound to a loopback address, the server therefore answers only requests whose Host is a
loopback name (or one `--allowed-hosts` lists); whatever the address, a request a browser sends
from a page (it carries `Origin`) is answered only for a page on this machine (or an application's,
such as an editor's webview) or one `--allowed-origins` (or $CHATAPP_ALLOWED_ORIGINS) lists, and
only those get CORS headers. Local clients send no Origin and are not affected.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from chatapp.errors import SettingsError

ORIGINS_ENV = "CHATAPP_ALLOWED_ORIGINS"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WEB_SCHEMES = frozenset({"http", "https"})
# Origins only an application on this machine has (an editor's webview, a desktop app's page), as Ollama allows
# them by default: no web site can send them.
LOCAL_APP_SCHEMES = frozenset({"app", "tauri", "vscode-webview", "vscode-file"})
PREFLIGHT_MAX_AGE_S = "600"
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")  # scheme://host[:port], no path


def split_list(values: Iterable[str]) -> tuple[str, ...]:
    """Names given as repeated flags, comma-separated, or both."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def is_loopback_name(name: str) -> bool:
    """localhost, or an address of the loopback network (127.0.0.0/8, ::1): reachable from this machine only."""
    name = name.lower().rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without its port: `[::1]:8080` is `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class AccessPolicy:
    """The Host and Origin rules of one server."""

    check_host: bool  # bound to a loopback address, or names listed
    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: tuple[str, ...] = ()  # origins, or patterns such as https://*.example.com; * for any

    @classmethod
    def for_address(
        cls, bound_to_loopback: bool, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()
    ) -> AccessPolicy:
        hosts = frozenset(name.lower().rstrip(".").strip("[]") for name in allowed_hosts)
        origins = tuple(origin.lower().rstrip("/") for origin in allowed_origins)
        return cls(bound_to_loopback or bool(hosts), hosts, origins)

    @classmethod
    def configured(cls, bound_to: str, allowed_hosts: Iterable[str], allowed_origins: Iterable[str]) -> AccessPolicy:
        """The rules of a server bound to `bound_to` with these names and origins allowed; a SettingsError naming
        one that is written as something else."""
        for name in allowed_hosts:
            if name != "*" and ("/" in name or "*" in name or name.count(":") == 1 or not name.strip(".[]")):
                raise SettingsError(
                    f"--allowed-hosts {name!r} is not a host name; give each name alone, such as chatapp.lan (no "
                    "scheme, no port, no pattern), or * for any"
                )
        for origin in allowed_origins:
            if origin not in ("*", "null") and not ORIGIN.fullmatch(origin.lower().rstrip("/")):
                raise SettingsError(
                    f"--allowed-origins {origin!r} is not an origin; write a page's origin, such as "
                    "https://app.example.com or https://*.example.com (no path)"
                )
        return cls.for_address(is_loopback_name(bound_to), allowed_hosts, allowed_origins)

    def host_refusal(self, header: str | None) -> str | None:
        """Why a request with this Host header is refused; None when it is answered."""
        if not self.check_host or header is None:
            return None
        name = host_name(header)
        if is_loopback_name(name) or name.rstrip(".") in self.allowed_hosts or "*" in self.allowed_hosts:
            return None
        return (
            f"Host {header!r} is not a name of this server (a web page may be reaching it by DNS rebinding); "
            f"to answer requests for it, start chatapp serve with --allowed-hosts {name}"
        )

    def origin_allowed(self, origin: str) -> bool:
        """A page on this machine, or one the allowed origins list (a malformed origin is neither)."""
        origin = origin.strip().lower().rstrip("/")
        try:
            parts = urlsplit(origin)
            hostname = parts.hostname
        except ValueError:  # `http://[::1` and the like
            return False
        if parts.scheme in WEB_SCHEMES and hostname is not None and is_loopback_name(hostname):
            return True
        if parts.scheme in LOCAL_APP_SCHEMES:
            return True
        return any(origin_pattern(pattern).fullmatch(origin) for pattern in self.allowed_origins)

    @staticmethod
    def origin_refusal(origin: str) -> str:
        return (
            f"requests from the web page at {origin} are refused (a page on another site may not use this "
            f"server); to allow it, start chatapp serve with --allowed-origins {origin} or set ${ORIGINS_ENV}"
        )


def origin_pattern(pattern: str) -> re.Pattern[str]:
    """An allowed origin as a pattern: `*` alone for any origin; in an origin, `*` stands for any run of
    characters but `/` (`https://*.example.com`), everything else for itself (an IPv6 address's brackets too)."""
    if pattern == "*":
        return re.compile(".*")
    return re.compile("[^/]*".join(re.escape(piece) for piece in pattern.split("*")))


def cors_headers(origin: str, requested_headers: str | None = None) -> dict[str, str]:
    """What lets an allowed page read the answer (and, for a preflight, send its request)."""
    headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Expose-Headers": "*"}
    if requested_headers is not None:
        headers |= {
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": requested_headers or "*",
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S,
        }
    return headers
