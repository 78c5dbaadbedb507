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
- :func:`wecom_markdown`: WeCom's markdown has no escape syntax
  (https://developer.work.weixin.qq.com/document/path/91770): the characters it gives a
  meaning to (``<font>``, ``<@userid>``, ``[text](url)``, ``**``, `` ` ``) are replaced
  by their fullwidth forms, which read the same.
- :func:`feishu_text`: Feishu text messages (mentions are ``<at>`` tags there too).
- :func:`feishu_markdown`: Feishu card markdown takes HTML entities for its special
  characters (the card markdown guide's escape table: ``&lt;`` ``&gt;`` ``&amp;``
  ``&#42;`` ``&#91;`` ...), which also stops ``<at id=all></at>`` and links.

Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "cut",
    "feishu_markdown",
    "feishu_text",
    "github_cell",
    "github_markdown",
    "show_controls",
    "terminal",
    "wecom_markdown",
]

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
    bidirectional override reaches it (newlines kept when ``newlines``)."""
    return show_controls(text, "\n" if newlines else "")


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
    text = show_controls(" ".join(text.splitlines()) if "\n" in text else text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _LINK_OPEN.sub(r"]\\", _MD_PUNCT.sub(r"\\\1", text))
    # After the punctuation: the backslash GitHub shows for "\#" is no link either way.
    text = _MENTION.sub(lambda m: m[1] + _ZWSP, text)
    return _AUTOLINK.sub(
        lambda m: f":{_ZWSP}//" if m[1] else f"{m[2]}{_ZWSP}{m[3]}",
        text,
    )


_BARE_AMP = re.compile(r"&(?!(?:amp|lt|gt|quot|#\d+);)")
_BARE_PIPE = re.compile(r"(?<!\\)\|")


def github_cell(text: str) -> str:
    """A GitHub Markdown table cell that may hold the farm's own emphasis (``**!**``):
    nothing in it can end the row, open a tag, link or mention. Text from outside is
    to pass :func:`github_markdown` first; this one leaves its escapes as they are."""
    text = show_controls(" ".join(text.splitlines()) if "\n" in text else text, _ZWSP)
    text = _BARE_AMP.sub("&amp;", text).replace("<", "&lt;").replace(">", "&gt;")
    text = _BARE_PIPE.sub(r"\\|", text).replace("](", "]\\(")
    return _MENTION.sub(lambda m: m[1] + _ZWSP, text)


_WECOM = str.maketrans(
    {"<": "\uff1c", ">": "\uff1e", "[": "\uff3b", "]": "\uff3d", "*": "\uff0a", "`": "\uff40"}
)


def wecom_markdown(text: str) -> str:
    """``text`` as inert WeCom markdown (one line)."""
    return show_controls(" ".join(text.splitlines())).translate(_WECOM)


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
    return show_controls(text, "\n").translate(_ANGLES)


def feishu_markdown(text: str) -> str:
    """``text`` as inert Feishu / Lark card markdown (one line)."""
    return show_controls(" ".join(text.splitlines())).translate(_FEISHU)
