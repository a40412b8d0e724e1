"""Server URLs as users type them: checked when a config is built, one message per mistake.

A mistyped URL used to reach httpx and end in a traceback (`InvalidURL`), a misleading error
(`http://host:30000@abc` read as credentials `host:30000`) or a "connection reset" for a port
that cannot exist. `server_url` turns each into one line naming the flag and the value, and
never repeats a password or key written into the URL. `bearer_header` is how every client
(gen, bench, extract's vLLM states) sends --api-key to one.
"""

from __future__ import annotations

import ipaddress
import re

from eagle3kit.errors import UserError

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_ADDRESS_PORT = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9A-Fa-f:.]+\]):\d+$")


def server_url(text: str, flag: str = "--server", *, concurrency: bool = False) -> str:
    """`text` as a normalized server URL (`http://host:port`, no trailing / or /v1); a scheme
    may be left out (http). Raises UserError naming `flag` for anything else. `concurrency`:
    the flag takes `URL@N`, and `text` is what is left once a valid @N is split off."""
    expected = "http(s)://HOST:PORT" + ("[@CONCURRENCY]" if concurrency else "")
    url = text.strip()
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    cut = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]

    def bad(why: str) -> UserError:
        return UserError(f"{flag} {text.strip()}: {why}; expected {expected}")

    if "@" in netloc:
        before, _, after = netloc.rpartition("@")
        if _ADDRESS_PORT.match(before):  # a typo after the port, not credentials
            if concurrency:
                raise bad(
                    f"the concurrency after @ must be a whole number like @128, not {after!r}"
                )
            raise bad(f"{flag} takes no @concurrency, and {after!r} follows the port")
        raise UserError(
            f"{flag} {_masked(scheme, netloc, tail)}: a server URL cannot carry credentials; "
            "pass an API key with --api-key or EAGLE3KIT_API_KEY"
        )
    if scheme.lower() not in ("http", "https"):
        raise bad(f"the scheme must be http or https, not {scheme!r}")
    _, port = _host_port(netloc, bad)
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise bad(f"the port must be a number from 1 to 65535, not {port!r}")
    if "?" in tail or "#" in tail:
        raise bad("a server URL has no query or fragment")
    base = f"{scheme.lower()}://{netloc}{tail}".rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _host_port(netloc: str, bad) -> tuple[str, str | None]:
    if netloc.startswith("["):
        inside, closed, after = netloc[1:].partition("]")
        if not closed or (after and not after.startswith(":")):
            raise bad("an IPv6 address goes in brackets, as in http://[::1]:30000")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise bad(f"{inside!r} is not an IPv6 address") from None
        return inside, after[1:] if after else None
    if netloc.count(":") > 1:
        raise bad("no host name (an IPv6 address goes in brackets, as in http://[::1]:30000)")
    host, colon, port = netloc.partition(":")
    if not host:
        raise bad("no host name")
    if not _HOSTNAME.match(host):
        raise bad(f"{host!r} is not a host name or address")
    return host, port if colon else None


def _masked(scheme: str, netloc: str, path: str) -> str:
    """The URL with what is before the last @ hidden: it may be a password or key."""
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{path}"


def bearer_header(api_key: str | None) -> dict[str, str]:
    """The header that carries --api-key to a server; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
