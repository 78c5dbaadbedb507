"""One masking of secrets for everything the farm prints, logs, stores or posts.

A secret reaches the farm's text in three shapes, all masked here:

- a URL's user information: ``scheme://user:PASSWORD@host`` becomes
  ``scheme://user:***@host``; a bare user on HTTP is a token
  (``https://TOKEN@host`` becomes ``https://***@host``), elsewhere a login
  (``ssh://git@host`` is kept);
- a URL's secret-looking query parameters (``password``, ``token``, ``key``, ``sig``,
  ``secret``, ``access_token``, ``api_key``, ``auth``, ``credential`` ..., any case,
  as a whole word of the name): ``?password=S`` becomes ``?password=***``; the
  PostgreSQL URL ``postgresql://u@h/db?password=S`` is the case that leaked;
- the value of a secret-looking variable name (``*TOKEN*``, ``*SECRET*``,
  ``*PASSWORD*``, ``*_KEY``...; :func:`farm.engines.environment.looks_secret`), which
  :func:`mask_mapping` masks whole.

Pure: no I/O, importable by every stage. Callers mask at the edge where text leaves
the process (a printer, an error message, a spool file, an export, a comment).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

__all__ = ["MASK", "mask_endpoint", "mask_mapping", "mask_secrets", "secret_values"]

MASK = "***"

# scheme://user[:password]@ ; the password runs to the last @ before the path. No word
# boundary before the scheme: a URL glued to what precedes it (``\x1b[31mpostgresql://``
# in an engine's coloured log, ``1https://``) is masked all the same.
_USERINFO = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]*)(?::(?P<password>[^/\s]*))?@"
)
_HTTP = ("http://", "https://")
# A query parameter whose name says it is a secret: a word of the name (split at _ - .)
# is one of these. ``sig``/``signature`` are presigned-URL credentials (S3, Azure SAS).
_SECRET_WORDS = (
    "password|passwd|pwd|pass|secret|token|key|apikey|sig|signature|auth|credential|"
    "credentials|sslpassword"
)
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&;](?:[A-Za-z0-9]+[_.-])*(?:" + _SECRET_WORDS + r")(?:[_.-][A-Za-z0-9]+)*=)"
    r"(?P<value>[^&#\s\"'<>]*)",
    re.IGNORECASE,
)


def mask_secrets(text: str) -> str:
    """``text`` with every URL credential in it masked: the password (or an HTTP bare
    token) of the user information and the value of each secret-looking query
    parameter. Text without a URL is returned unchanged."""

    def userinfo(m: re.Match[str]) -> str:
        if m["password"] is not None:
            return f"{m['scheme']}{m['user']}:{MASK}@"
        http = m["scheme"].lower().endswith(_HTTP)
        return f"{m['scheme']}{MASK}@" if m["user"] and http else m[0]

    def param(m: re.Match[str]) -> str:
        return m["lead"] + (MASK if m["value"] else "")

    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(userinfo, text)
    return _SECRET_PARAM.sub(param, text) if "=" in text else text


def mask_endpoint(url: str) -> str:
    """``scheme://host[:port]/***``: where a request went, with nothing that may be a
    credential (a webhook's path is its secret). Never raises: a URL that does not
    parse (a bad port, an unclosed ``[``) is ``***``."""
    try:
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            return MASK
        host = parts.hostname or MASK
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return MASK
    return f"{parts.scheme}://{host}{port}/{MASK}"


def secret_values(text: str) -> list[str]:
    """The secrets :func:`mask_secrets` would mask in ``text`` (longest first): what to
    replace when the same secret may show up in other text, e.g. a driver's error."""
    found: set[str] = set()
    for m in _USERINFO.finditer(text):
        if m["password"]:
            found.add(m["password"])
        elif m["user"] and m["scheme"].lower().endswith(_HTTP):
            found.add(m["user"])
    found.update(m["value"] for m in _SECRET_PARAM.finditer(text) if m["value"])
    return sorted(found, key=len, reverse=True)


def mask_mapping(values: Mapping[str, str], secret_name: Callable[[str], bool]) -> dict[str, str]:
    """``values`` (an environment) to show or store: the value of a name for which
    ``secret_name`` holds is ``***``, every other value passes :func:`mask_secrets`."""
    return {k: MASK if secret_name(k) else mask_secrets(v) for k, v in values.items()}
