"""Pure: what ``serve --http HOST:PORT`` means, and when it needs a bearer token.

The endpoint binds 127.0.0.1 unless told otherwise. Binding anything that is not
loopback exposes the operator's view of every DM (who talks to whom, outcomes,
latencies) to the network, so it is refused without a token.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hermes_actors.core.clipping import shown

__all__ = ["DEFAULT_HTTP_HOST", "MAX_PORT", "TOKEN_ENV", "HttpSettings", "check_port", "http_settings",
           "is_loopback_host", "parse_http_address"]

DEFAULT_HTTP_HOST = "127.0.0.1"
TOKEN_ENV = "HERMES_ACTORS_HTTP_TOKEN"
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{1,512}\Z")  # RFC 6750 b64token: safe in a header and a cookie
_EXAMPLE = "e.g. 127.0.0.1:9464, :9464 or [::1]:9464"
MAX_PORT = 65535


def check_port(port: int | str, what: str, *, lowest: int = 0) -> int:
    """Pure: ``port`` when it is a TCP port number (``lowest`` to :data:`MAX_PORT`): the one range rule of every
    port option.

    Args:
        port: the port, or its decimal digits as typed, after a ``-`` for a negative one (of any length: 100,000
            of them are out of range, not an ``int()`` past Python's limit on digits).
        what: the option and value the message names first (e.g. ``--http '127.0.0.1:70000'``).
        lowest: 0 where "any free port" makes sense (``--http``), 1 where clients must find the port.

    Returns:
        The port.

    Raises:
        ValueError: out of range, e.g. "--http '127.0.0.1:70000': the port 70000 is out of range (0-65535)"
            (``-1`` too, and ``-0``: a signed port is none a server binds, nor a client reaches).
    """
    text = str(port)
    negative = text.startswith("-")
    digits = text.removeprefix("-").lstrip("0") or "0"
    if negative or len(digits) > len(str(MAX_PORT)) or not lowest <= int(digits) <= MAX_PORT:
        raise ValueError(f"{what}: the port {shown(port, str(port))} is out of range ({lowest}-{MAX_PORT})")
    return int(digits)


@dataclass(frozen=True)
class HttpSettings:
    """Where the operator endpoint listens and the bearer token it requires (None: no token)."""

    host: str
    port: int
    token: str | None = None

    @property
    def url(self) -> str:
        """The base URL (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"


def parse_http_address(text: str) -> tuple[str, int]:
    """Parse ``--http``'s ``HOST:PORT`` (``:PORT`` or ``PORT`` alone bind 127.0.0.1).

    Args:
        text: the option's value.

    Returns:
        (host, port); port 0 asks the kernel for a free port.

    Raises:
        ValueError: the value is not HOST:PORT with a port in 0..65535, naming what is wrong.
    """
    value = text.strip()
    if not value:
        raise ValueError(f"--http is empty: pass HOST:PORT ({_EXAMPLE})")
    if "://" in value:
        raise ValueError(f"--http {shown(text)}: pass HOST:PORT, not a URL ({_EXAMPLE})")
    if value.startswith("["):  # [IPv6]:PORT
        host, sep, port_text = value[1:].partition("]:")
        if not sep or not host:
            raise ValueError(f"--http {shown(text)}: an IPv6 host goes in brackets followed by :PORT ({_EXAMPLE})")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"--http {shown(text)}: {shown(host)} is not an IPv6 address") from None
    elif value.count(":") > 1:
        raise ValueError(f"--http {shown(text)}: put an IPv6 host in brackets, e.g. [::1]:9464")
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            host, port_text = "", value
        host = host or DEFAULT_HTTP_HOST
        if any(c.isspace() or c in "/?#@" for c in host):
            raise ValueError(f"--http {shown(text)}: {shown(host)} is not a host name or address ({_EXAMPLE})")
    unsigned = port_text.removeprefix("-")  # a negative port is out of range (check_port), not "not a number"
    if not (unsigned.isascii() and unsigned.isdigit()):  # not '²', a digit int() refuses
        raise ValueError(f"--http {shown(text)}: the port {shown(port_text)} is not a number ({_EXAMPLE})")
    return host, check_port(port_text, f"--http {shown(text)}")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts; any other name does not).

    Args:
        host: an IP address or a host name.

    Returns:
        True for 127.0.0.0/8, ::1 and ``localhost``.
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name may resolve anywhere: treat it as exposed


def http_settings(address: str, token: str | None, env: Mapping[str, str] | None = None) -> HttpSettings:
    """The endpoint's settings from ``--http`` and ``--http-token`` (else ``$HERMES_ACTORS_HTTP_TOKEN``).

    Args:
        address: ``--http``'s value.
        token: ``--http-token``'s value (None: read the environment).
        env: the environment (default ``os.environ``).

    Returns:
        The settings.

    Raises:
        ValueError: a bad address, an empty token, or a non-loopback address without a token.
    """
    host, port = parse_http_address(address)
    chosen = token if token is not None else (os.environ if env is None else env).get(TOKEN_ENV)
    if chosen is not None:
        chosen = chosen.strip()
        if not chosen:
            raise ValueError(f"the HTTP bearer token is empty: set --http-token or {TOKEN_ENV} to a secret")
        if not _TOKEN_RE.match(chosen):
            raise ValueError("the HTTP bearer token may only hold letters, digits and . _ ~ + / = - "
                             "(e.g. the output of `python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    if chosen is None and not is_loopback_host(host):
        raise ValueError(
            f"--http {shown(address)} binds {shown(host, host)}, which is not loopback: anyone who can reach it would "
            "see every DM's "
            f"sender, target and outcome. Set a bearer token with {TOKEN_ENV} (or --http-token), "
            f"or bind 127.0.0.1"
        )
    return HttpSettings(host, port, chosen)
