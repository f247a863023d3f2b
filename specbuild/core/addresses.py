"""Network addresses the CLI takes, checked one way: ports, gRPC `HOST:PORT`, HTTP URLs.

`check_port` is the one port rule (`serve --grpc-port`, a URL's port): a whole number in 1..65535,
written in ASCII digits. Without it `generate --url 127.0.0.1:PORT+65536` reached the server on PORT
(gRPC wraps the port modulo 2^16; `str.isdigit` also accepts digits such as '８' or '²').
`grpc_address` reads `generate / bench / tune --url` and `http_url` reads `bench --metrics-url`; both
refuse a host that is not an IP address or a DNS name (spaces, other characters) and name the option.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

from specbuild.core.errors import ClientError, SpecbuildError

MAX_PORT = 65535
_DIGITS = re.compile(r"[0-9]{1,5}")
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens
# (underscores too: container and service names use them, and resolvers accept them)
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")


def check_port(port: int | str, *, option: str, error: type[SpecbuildError] = ClientError) -> int:
    """`port` as an int in 1..65535 (text: ASCII digits only), or an `error` naming `option`."""
    text = str(port)
    if isinstance(port, bool) or not (_DIGITS.fullmatch(text) and 0 < int(text) <= MAX_PORT):
        raise error(
            f"{option}: {text!r} is not a port number",
            expected=f"a whole number 1 .. {MAX_PORT}",
            found=text[:40],
            fix=f"pass {option} with the server's port, e.g. 8001",
        )
    return int(text)


def check_host(host: str, *, option: str) -> str:
    """`host` when it is an IPv4 / IPv6 address or a DNS host name."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(host):
        raise ClientError(
            f"{option}: {host[:80]!r} is not a host",
            expected="an IP address (IPv6 in brackets) or a host name",
            found=host[:80],
            fix=f"pass {option} 127.0.0.1:8001",
        )
    return host


def grpc_address(url: str, *, option: str = "--url") -> str:
    """'grpc://HOST:PORT' or 'HOST:PORT' ('[::1]:PORT' for IPv6) -> 'HOST:PORT', checked."""
    text = url.strip().removeprefix("grpc://").rstrip("/")
    if "://" in text:
        raise ClientError(
            f"{option}: {url[:80]!r} is not a gRPC address",
            expected="HOST:PORT of the server's gRPC endpoint (not an http:// URL)",
            found=url[:80],
            fix=f"pass {option} 127.0.0.1:8001 (the --grpc-port of `specbuild serve`)",
        )
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ClientError(
            f"{option}: cannot read the server address {url[:80]!r}",
            expected="HOST:PORT of the gRPC endpoint, e.g. 127.0.0.1:8001",
            found=url[:80],
            fix=f"pass {option} 127.0.0.1:8001",
        )
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in bare and bare == host:  # an IPv6 address needs its brackets: [::1]:8001
        raise ClientError(
            f"{option}: IPv6 address {host!r} without brackets",
            expected="[ADDRESS]:PORT",
            found=url[:80],
            fix=f"pass {option} [{host}]:{port}",
        )
    check_host(bare, option=option)
    check_port(port, option=option)
    return text


def http_url(url: str, *, option: str) -> str:
    """An http(s)://HOST[:PORT]/PATH URL, checked (scheme, host, port)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientError(
            f"{option}: {url[:80]!r} is not an http URL",
            expected="http://HOST:PORT/PATH, e.g. http://127.0.0.1:8002/metrics",
            found=url[:80],
            fix=f"pass {option} http://127.0.0.1:8002/metrics",
        )
    check_host(parts.hostname or "", option=option)
    after_host = parts.netloc.rpartition("@")[2].rpartition("]")[2]  # [v6]:port, host:port
    if ":" in after_host:
        check_port(after_host.rpartition(":")[2], option=option)
    return url.strip()
