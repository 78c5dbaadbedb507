"""Text that came from outside (an engine's error, a commit subject, a job or cell
name, a user's note) rendered as inert text, by each channel's own rules.

Each function takes plain text and returns text that the channel shows exactly as
written: no mention pings anyone, no tag or link renders, no escape sequence reaches a
terminal. Control characters (C0, C1, DEL and the Unicode format characters such as
the bidirectional overrides, "Trojan Source", CVE-2021-42574) are shown escaped
(``\\x1b``, ``\\u202e``) in every channel. Cut text with :func:`cut` *before*
escaping it, so a cut never splits an escape or an entity.

- :func:`terminal`: control characters escaped; newlines kept only when asked.
- :func:`github_markdown`: GitHub Flavoured Markdown (PR comments, ``--format md``):
  the inline Markdown punctuation (emphasis, code, links, table pipes) backslash-escaped
  (CommonMark "Backslash escapes"), ``<`` ``>``
  ``&`` as entities, ``@name`` and ``#123`` kept from linking by a zero-width space,
  bare URLs kept from autolinking the same way, ``|`` escaped for table cells.
- :func:`github_code`: an inline code span (a quoted error in a list item): shown
  verbatim, nothing in it renders; a comment marker's ``<!--`` broken.
- :func:`wecom_markdown`: WeCom's markdown has no escape syntax
  (https://developer.work.weixin.qq.com/document/path/91770): the characters it gives a
  meaning to (``<font>``, ``<@userid>``, ``[text](url)``, ``**``, `` ` ``) are replaced
  by their fullwidth forms, which read the same.
- :func:`feishu_text`: Feishu text messages (mentions are ``<at>`` tags there too).
- :func:`feishu_markdown`: Feishu card markdown takes HTML entities for its special
  characters (the card markdown guide's escape table: ``&lt;`` ``&gt;`` ``&amp;``
  ``&#42;`` ``&#91;`` ...), which also stops ``<at id=all></at>`` and links.
- :func:`slack_mrkdwn`: Slack mrkdwn: ``&`` ``<`` ``>`` as entities (mentions and
  links are ``<...>`` there); newlines kept.
- :func:`html_text`: HTML text or attribute value: :func:`html.escape`.

Every one of them masks URL credentials first (:func:`farm.masking.mask_secrets`), so
whichever channel a text reaches, no password rides along.

Where outside text enters the farm's records it becomes :class:`Untrusted` (a ``str``
whose credentials are masked, made only by :func:`untrusted`, which never raises):
the pydantic fields that hold it are typed :data:`UntrustedText` (a cell's error and
log tail, a request's error, an alert's summary, error, note and news, a golden's
case name, a bisection's repository, subjects and reasons), so a record built by any
stage, or read back from any store, holds no secret for a later page to show.

Pure: no I/O.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import TYPE_CHECKING, Annotated, Any

from farm.masking import MASK, mask_secrets

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

__all__ = [
    "CHANNELS",
    "Untrusted",
    "UntrustedText",
    "cut",
    "feishu_markdown",
    "feishu_text",
    "github_cell",
    "github_code",
    "github_markdown",
    "html_text",
    "show_controls",
    "slack_mrkdwn",
    "terminal",
    "untrusted",
    "wecom_markdown",
]


class Untrusted(str):
    """Text that came from outside the farm (an engine's output or error, a prompt, a
    golden or harness file, a remote service's answer, git metadata), with every URL
    credential in it masked. Made by :func:`untrusted` (``Untrusted(x)`` is the
    same): no value of this type can hold a password a mask would hide. It is still
    text to escape: each channel shows it through its own function (:data:`CHANNELS`).
    """

    __slots__ = ()

    def __new__(cls, text: object = "") -> Untrusted:
        if type(text) is cls:
            return text  # masked when it was made
        return super().__new__(cls, _masked(text))


def _masked(text: object) -> str:
    # Never raises: a value whose str() fails, or text the masking cannot take, is
    # the mask itself rather than an error on the way to a report.
    try:
        return mask_secrets(text if isinstance(text, str) else str(text))
    except Exception:  # masking must never be why a record is lost
        return MASK


def untrusted(text: object) -> Untrusted:
    """``text`` (from outside the farm) as :class:`Untrusted`: URL credentials masked.
    Never raises."""
    return Untrusted(text)


class _MaskedOnEntry:
    """Pydantic metadata: a ``str`` field whose value becomes :class:`Untrusted` when
    a model is built or read back (pydantic is imported only when a model uses it)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(untrusted, handler(source))

    def __repr__(self) -> str:
        return "MaskedOnEntry"


UntrustedText = Annotated[str, _MaskedOnEntry()]
"""The type of a record's field that holds outside text: a ``str`` to the type
checker, an :class:`Untrusted` (credentials masked) in every built model."""

_ELLIPSIS = "..."
_ZWSP = "\u200b"


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _is_control(ch: str, keep: str) -> bool:
    return ch not in keep and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co")


def show_controls(text: str, keep: str = "") -> str:
    """``text`` with every control or format character not in ``keep`` shown escaped
    (``\\x1b``, ``\\x00``, ``\\u202e``)."""
    if text.isprintable():  # no Cc, Cf, Zl, Zp... character: nothing to show
        return text
    return "".join(_escaped(c) if _is_control(c, keep) else c for c in text)


def terminal(text: str, *, newlines: bool = False) -> str:
    """``text`` to print on a terminal: no escape sequence, no carriage return, no
    bidirectional override reaches it (newlines kept when ``newlines``); URL
    credentials masked."""
    return show_controls(untrusted(text), "\n" if newlines else "")


def cut(text: str, limit: int, marker: str = _ELLIPSIS) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``marker`` when cut;
    never between a character and its combining marks. Cut raw text, then escape it."""
    if len(text) <= limit:
        return text
    end = max(0, limit - len(marker))
    while end > 0 and unicodedata.combining(text[end]):
        end -= 1
    return text[:end] + marker


# Emphasis, code and table pipes; "_" only where it can open or close emphasis (GFM
# takes no intraword underscore), "[" only as the start of a link ("](").
_MD_PUNCT = re.compile(r"([\\`*|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
_LINK_OPEN = re.compile(r"\](?=[(\[:])")
_MENTION = re.compile(r"([@#])(?=[A-Za-z0-9_])")
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])(://)|\b(www)(\.)")


def github_markdown(text: str) -> str:
    """``text`` as inert GitHub Markdown, safe inline and in a table cell (one line:
    newlines become spaces)."""
    raw: str = untrusted(text)
    text = show_controls(" ".join(raw.splitlines()) if "\n" in raw else raw)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _LINK_OPEN.sub(r"]\\", _MD_PUNCT.sub(r"\\\1", text))
    # After the punctuation: the backslash GitHub shows for "\#" is no link either way.
    text = _MENTION.sub(lambda m: m[1] + _ZWSP, text)
    return _AUTOLINK.sub(
        lambda m: f":{_ZWSP}//" if m[1] else f"{m[2]}{_ZWSP}{m[3]}",
        text,
    )


_BACKTICKS = re.compile(r"`+")


def github_code(text: str) -> str:
    """``text`` as an inline GitHub Markdown code span (a list item's quoted error, not a
    table cell): shown verbatim (``<before>``, ``*``, ``_``), yet nothing in it is a
    tag, link, autolink or mention there. On one line; the fence is longer than any run
    of backticks in it; a comment's ``<!--`` / ``-->`` (the farm's PR comment marker)
    is kept from forming by a zero-width space."""
    raw: str = untrusted(text)
    raw = show_controls(" ".join(raw.splitlines()) if "\n" in raw else raw)
    raw = raw.replace("<!--", f"<{_ZWSP}!--").replace("-->", f"--{_ZWSP}>")
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(raw)), default=0) + 1)
    pad = " " if raw.startswith(("`", " ")) or raw.endswith(("`", " ")) else ""
    return f"{fence}{pad}{raw}{pad}{fence}" if raw else ""


_BARE_AMP = re.compile(r"&(?!(?:amp|lt|gt|quot|#\d+);)")
_BARE_PIPE = re.compile(r"(?<!\\)\|")


def github_cell(text: str) -> str:
    """A GitHub Markdown table cell that may hold the farm's own emphasis (``**!**``):
    nothing in it can end the row, open a tag, link or mention. Text from outside is
    to pass :func:`github_markdown` first; this one leaves its escapes as they are."""
    raw: str = untrusted(text)
    text = show_controls(" ".join(raw.splitlines()) if "\n" in raw else raw, _ZWSP)
    text = _BARE_AMP.sub("&amp;", text).replace("<", "&lt;").replace(">", "&gt;")
    text = _BARE_PIPE.sub(r"\\|", text).replace("](", "]\\(")
    return _MENTION.sub(lambda m: m[1] + _ZWSP, text)


_WECOM = str.maketrans(
    {"<": "\uff1c", ">": "\uff1e", "[": "\uff3b", "]": "\uff3d", "*": "\uff0a", "`": "\uff40"}
)


def wecom_markdown(text: str) -> str:
    """``text`` as inert WeCom markdown (one line)."""
    return show_controls(" ".join(untrusted(text).splitlines())).translate(_WECOM)


_ANGLES = str.maketrans({"<": "\uff1c", ">": "\uff1e"})
_FEISHU = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "*": "&#42;",
        "~": "&#126;",
        "`": "&#96;",
        "[": "&#91;",
        "]": "&#93;",
    }
)


def feishu_text(text: str) -> str:
    """``text`` as an inert Feishu / Lark text message or ``plain_text`` element: text
    messages read ``<at user_id="all"></at>`` as a mention, so ``<`` ``>`` become
    their fullwidth forms; newlines kept."""
    return show_controls(untrusted(text), "\n").translate(_ANGLES)


def feishu_markdown(text: str) -> str:
    """``text`` as inert Feishu / Lark card markdown (one line)."""
    return show_controls(" ".join(untrusted(text).splitlines())).translate(_FEISHU)


def slack_mrkdwn(text: str) -> str:
    """``text`` as inert Slack mrkdwn: the three characters Slack requires escaped
    (mentions and links are ``<...>``) as entities; newlines kept."""
    text = show_controls(untrusted(text), "\n")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def html_text(text: object) -> str:
    """``text`` as HTML text or a quoted attribute value: ``& < > " '`` as entities,
    control characters shown escaped (newlines and tabs kept)."""
    return html.escape(show_controls(untrusted(text), "\n\t"))


CHANNELS: dict[str, tuple[str, ...]] = {
    "terminal": ("terminal",),
    "markdown": ("github_markdown", "github_code"),
    "html": ("html_text",),
    "slack": ("slack_mrkdwn",),
    "feishu": ("feishu_text", "feishu_markdown"),
    "wecom": ("wecom_markdown",),
}
"""Each channel's functions for outside text: the only ways a renderer shows it."""
