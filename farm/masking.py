"""One masking of secrets for everything the farm prints, logs, stores or posts.

What is secret, and how each shape of text is masked, lives here and nowhere else.
A secret reaches the farm's text in these shapes:

- a URL's user information: ``scheme://user:PASSWORD@host`` becomes
  ``scheme://user:***@host``; a bare user on HTTP is a token
  (``https://TOKEN@host`` becomes ``https://***@host``), elsewhere a login
  (``ssh://git@host`` is kept);
- a URL's secret-looking query parameters (``password``, ``token``, ``key``, ``sig``,
  ``secret``, ``access_token``, ``api_key``, ``auth``, ``credential`` ..., any case,
  as a whole word of the name): ``?password=S`` becomes ``?password=***``; the
  PostgreSQL URL ``postgresql://u@h/db?password=S`` is the case that leaked;
- the value of a secret-looking variable name (``*TOKEN*``, ``*SECRET*``,
  ``*PASSWORD*``, ``*_KEY``...; :func:`looks_secret`), masked whole in an environment
  (:func:`mask_env`, :func:`mask_mapping`) and in a job file's ``env`` mappings
  (:func:`mask_job_yaml`);
- the value of a secret option on a command line (``--api-key X``, ``--token=X``;
  :func:`mask_argv`);
- a secret known by value (a webhook URL, a token) wherever it shows up in text,
  whole or in pieces (:func:`redact`).

Text: :func:`mask_secrets` (also :func:`mask_text`); a store URL: :func:`mask_url`;
where a request went, nothing after the host: :func:`mask_endpoint`.

Pure: no I/O, importable by every stage (SQLAlchemy, which :func:`mask_url` parses
with, is imported only when it is called). Callers mask at the edge where text leaves
the process (a printer, an error message, a spool file, an export, a comment).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import yaml

__all__ = [
    "MASK",
    "looks_secret",
    "mask_argv",
    "mask_endpoint",
    "mask_env",
    "mask_job_yaml",
    "mask_mapping",
    "mask_secrets",
    "mask_text",
    "mask_url",
    "redact",
    "secret_values",
]

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
# A variable name that says it holds a secret, or is the farm's own configuration.
_SECRET_NAME = re.compile(
    r"TOKEN(?!S|IZER)|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|_KEY$|_KEY_|^FARM_|^RAY_AUTH",
    re.IGNORECASE,
)
# Option names that carry a secret: --token, --hf-token, --api-key, --client-secret. Not
# ``looks_secret``: engine options such as --tokenizer or --max-num-batched-tokens are
# no secrets.
_SECRET_OPTION_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|KEY)$", re.IGNORECASE
)
_NODE_PROPERTIES = re.compile(r"^(?:[&!]\S*\s+)+")
_OPTION = re.compile(r"^--?(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)(?:=(?P<value>.*))?$", re.DOTALL)
# The shortest piece of a known secret URL that :func:`redact` masks on its own.
_MIN_SECRET_PIECE = 8


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (or is the
    farm's own configuration, ``FARM_*``): never inherited, masked when shown."""
    return _SECRET_NAME.search(name) is not None


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


def mask_text(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (user information and
    secret-looking query parameters): :func:`mask_secrets`."""
    return mask_secrets(text)


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` to show or store: a secret-looking name's value (``*TOKEN*``,
    ``*SECRET*``, ``*PASSWORD*``, ``*_KEY``, ...) is ``***``; URLs lose their credentials."""
    return mask_mapping(env, looks_secret)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A command line to show: the value of a secret option (``--api-key X``,
    ``--token=X``) is ``***``; URLs lose their credentials."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        m = _OPTION.match(arg)
        if m and _SECRET_OPTION_NAME.search(m["name"].replace("-", "_")):
            if m["value"] is None:
                hide_next = True
                out.append(arg)
            else:
                out.append(f"{arg.split('=', 1)[0]}={MASK}")
            continue
        out.append(mask_text(arg))
    return out


def _secret_spans(node: yaml.Node, spans: list[tuple[int, int]], in_env: bool = False) -> None:
    """Where the values of secret-looking names of every ``env`` mapping lie in the text."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if in_env and isinstance(value, yaml.ScalarNode) and name and looks_secret(name):
                spans.append((value.start_mark.index, value.end_mark.index))
            else:
                _secret_spans(value, spans, in_env=name == "env")
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _secret_spans(item, spans)


def mask_job_yaml(text: str) -> str:
    """A job file's text to store or show, its layout and comments kept: the values of
    secret-looking names in each ``env`` mapping (``env: {HF_TOKEN: ...}``) become
    ``'***'``, and URLs lose their credentials. Text that is not YAML is only
    URL-masked."""
    spans: list[tuple[int, int]] = []
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _secret_spans(root, spans)
    except (yaml.YAMLError, RecursionError, ValueError):
        # Masking never raises: text that is not a job (too deep to walk) is only
        # URL-masked, and its secret-looking env values may show.
        spans = []
    # From the end, so earlier offsets stay valid; an anchor used twice is one span.
    for start, end in sorted(set(spans), reverse=True):
        value = text[start:end]
        # Kept: an anchor or tag before the value, the line break ending a block scalar.
        head = _NODE_PROPERTIES.match(value)
        lead = head[0] if head else ""
        tail = value[len(value.rstrip()) :]
        text = f"{text[:start]}{lead}'{MASK}'{tail}{text[end:]}"
    return mask_text(text)


def mask_url(url: str) -> str:
    """A store URL with its password and secret-looking query parameters (``?password=``,
    ``sslpassword``, ...) replaced by ``***`` (:func:`mask_secrets`), safe to print,
    log or write to a spool file. Never raises: a URL SQLAlchemy cannot parse keeps only
    its scheme."""
    # Imported here: masking is pure and imported by every stage, SQLAlchemy is not.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return mask_secrets(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        # Unparseable: do not echo anything that may hold a secret after the scheme.
        return url.partition("://")[0] + "://***"


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret (and each credential-bearing part of a URL) masked."""
    for secret in _expand(secrets):
        text = text.replace(secret, MASK)
    return text


def _expand(secrets: Sequence[str]) -> list[str]:
    out: set[str] = set()
    for s in secrets:
        if not s:
            continue
        out.add(s)
        try:
            parts = urlsplit(s)
        except ValueError:  # not a URL that parses: masked whole, above
            continue
        if parts.scheme and parts.netloc:
            # A credential may show up without the rest of its URL (a path in an
            # error, a query string in a log). Short pieces ("/s", "x=1") are left
            # alone: they hold no credential and would mask unrelated text.
            pieces = [parts.path, parts.query, *parts.path.split("/")]
            pieces += [v for _, _, v in (q.partition("=") for q in parts.query.split("&"))]
            out.update(p for p in pieces if len(p) >= _MIN_SECRET_PIECE)
    # Longest first, so a URL is masked whole before its parts.
    return sorted(out, key=len, reverse=True)
