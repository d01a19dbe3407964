"""Who may talk to the dashboard (SPEC §6). A loopback port is reachable by every local user, by
any page open in the user's browser (a page on another local port even counts as the same site),
and through any DNS name that resolves to 127.0.0.1 (DNS rebinding); the rules below are against
those.

Pure request checks, no I/O, so each rule reads (and is tested) on its own:

- the Host guard: a loopback name with our port, against DNS rebinding;
- the token: a fresh 32-byte secret per start, shown only in `dashboard.url` (0600), swapped for
  the `ab_ui` cookie (HttpOnly, SameSite=Strict) on first visit, compared in constant time;
- fetch metadata and Origin: a page served by another local port is *same-site* for cookies
  (browsers ignore ports there), so SameSite alone does not stop it from sending `ab_ui`;
  requests a browser marks as coming from another site or origin are refused for everything but
  a top-level navigation to the page itself;
- the response headers every answer carries.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping

COOKIE = "ab_ui"
TOKEN_PARAM = "t"
TOKEN_BYTES = 32  # SPEC §6: a fresh 32-byte random token per start

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# Headers that would open the dashboard to other origins; stripped from every response.
CORS_HEADERS = (
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Credentials",
    "Access-Control-Allow-Methods",
    "Access-Control-Allow-Headers",
    "Access-Control-Expose-Headers",
)

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def allowed_hosts(port: int) -> frozenset[str]:
    return frozenset(f"{name}:{port}" for name in LOOPBACK_NAMES)


def allowed_origins(port: int) -> frozenset[str]:
    return frozenset(f"http://{host}" for host in allowed_hosts(port))


def host_ok(host_values: list[str], port: int) -> bool:
    """Exactly one Host header, naming a loopback address with our port (case-insensitive)."""
    if len(host_values) != 1:
        return False
    return host_values[0].strip().lower() in allowed_hosts(port)


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison. Compares bytes: `hmac.compare_digest` refuses non-ASCII str."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("ascii"))


def cross_site(
    *, site: str | None, mode: str | None, dest: str | None, origin: str | None, port: int, page: bool
) -> bool:
    """Did a browser tell us this request comes from another site or origin?

    `site`, `mode`, `dest`: the Sec-Fetch-Site/-Mode/-Dest headers, set by every current browser;
    `origin` (the Origin header) covers older ones. Requests without either (curl, httpx, the
    user's own tools) are judged by Host and cookie alone. `page`: the request is for `/`, where
    a top-level navigation from elsewhere (a link, the `--open` redirect file) is how a user
    arrives.
    """
    if (site or "").lower() in ("cross-site", "same-site"):
        navigation = (mode or "").lower() == "navigate" and (dest or "document").lower() == "document"
        return not (page and navigation)
    return origin is not None and origin.lower() not in allowed_origins(port)
