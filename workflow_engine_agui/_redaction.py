"""Credentials out of the text of an error before a client reads it.

An error raised by a step -- a tool, a model client, a library under them -- may name a URL
whole: a model endpoint's user and password, an ``?api-key=...``. A ``RUN_ERROR`` goes to every
client of the thread, so the server says such URLs without their user, password, query string
and fragment; its log keeps the text whole. The text is the exception's own, in whatever form
the code that raised it wrote the URL -- with or without a scheme, inside quotes or brackets,
several in a row, escaped as JSON or ``repr`` write it, percent-encoded -- so each of those is
read here, and what is not part of a URL (the punctuation after it) is left as it was.
"""

from __future__ import annotations

import re

_ESCAPED = re.compile(r"\\+(?:/|u00(2[fF3]|40|3[aAfFdD]|26))")
"""A ``/`` escaped as JSON may write it (``\\/``, doubled by ``repr``), or one of the
characters that delimit a URL's parts written as ``\\u00XX``."""
_PERCENT = re.compile(r"%(2[fF]|3[aA]|40|3[fF]|23|26|3[dD])")
"""A URL's delimiters percent-encoded (a URL inside another one's query string)."""
_URL_START = re.compile(
    r"(?:\b[a-zA-Z][\w+.-]*:|(?<![^\s'\"(<\[{=,;|`]))//"
    r"|(?<![\w.+-])(?i:mailto|sips?|xmpp|im|pres):(?=[^\s@]*@)"
)
"""Where a URL begins: ``scheme://``, a bare ``//`` after a space, quote, bracket or
separator, or a scheme whose user comes without ``//`` (``mailto:user@host``). (A password
holding ``//`` after one of those may end its URL early: RFC 3986 has no ``/`` in a password.)"""
_URL_END = re.compile(r"[\s\"<>`]")
_QUERY = re.compile(r"[?#]")
_PATH_QUERY = re.compile(r"(?<![^\s'\"(\[{=:,])(/[^\s?#\"'<>]*)\?([^\s\"<>]*=[^\s\"<>]*)")
"""A path without a scheme or host whose query string holds a value (``url:
/v1/chat?api-key=...``, as urllib3 writes it)."""
_TRAILING = "'\".,;:!?)]}>"
"""What may follow a URL in prose and is not part of it."""


def without_credentials(text: str) -> str:
    """``text`` with every URL in it said without its user, password, query string and
    fragment."""
    text = _ESCAPED.sub(_unescaped, text)
    text = _PERCENT.sub(lambda m: chr(int(m[1], 16)), text)
    out: list[str] = []
    at = 0
    starts = [m.span() for m in _URL_START.finditer(text)]
    for i, (start, rest) in enumerate(starts):
        if start < at:  # (inside the URL before it: its query's ``redirect=http://...``)
            continue
        ended = _URL_END.search(text, rest)
        end = ended.start() if ended else len(text)
        following = starts[i + 1][0] if i + 1 < len(starts) else end
        query = _QUERY.search(text, rest, end)
        if following < (query.start() if query else end):  # the next URL starts first
            end = following
        out.append(text[at:rest])
        out.append(_cleaned(text[rest:end]))
        at = end
    out.append(text[at:])
    return _PATH_QUERY.sub(lambda m: m[1] + _given_back("?" + m[2]), "".join(out))


def _unescaped(match: re.Match[str]) -> str:
    return "/" if match[1] is None else chr(int(match[1], 16))


def _cleaned(rest: str) -> str:
    """What follows a URL's ``//`` (or ``mailto:``): its host and path, without the user and
    password before them or the query string and fragment after them -- and with what ended
    the sentence after it."""
    cut = len(rest)
    for mark in "?#":
        found = rest.find(mark)
        if found >= 0:
            cut = min(cut, found)
    head, tail = rest[:cut], rest[cut:]
    at = head.rfind("@")
    if at >= 0 and _is_user(head[:at]):
        head = head[at + 1 :]
    return head + _given_back(tail)


def _is_user(before: str) -> bool:
    """Whether ``before`` (what precedes an ``@`` in a URL) is a user and password: no ``/``
    before its first ``:``, or none at all -- not a path (``h/users/bob@x``) and not a host and
    port (``h:8080/x@y``)."""
    slash = before.find("/")
    if slash < 0:
        return True
    colon = before.find(":")
    return 0 <= colon < slash and not before[colon + 1 : slash].isdigit()


def _given_back(dropped: str) -> str:
    """Of a query string or fragment that is dropped, the punctuation that ended the sentence
    after it (``(see http://h/a#b).`` keeps its ``).``; ``is it at http://h/v1?`` its ``?``)."""
    kept = dropped.rstrip(_TRAILING)
    return dropped[len(kept) :]
