"""Credentials out of text that people other than the operator read: errors, endpoints.

An error raised by a step -- a tool, a model client, a library under them -- may name a URL
whole: a model endpoint's user and password, an ``?api-key=...``. An AG-UI ``RUN_ERROR`` goes to
every client of the thread, so the server says such URLs without their user, password, query
string and fragment (its log keeps the text whole); the command line says a model endpoint so,
and a run records it so. The text is the exception's own, in whatever form the code that
raised it wrote the URL -- with or without a scheme, glued to the words before it, inside
quotes or brackets, several in a row, one in another's path, escaped as JSON or ``repr`` write
it, percent-encoded (once or twice) inside another URL, or ``user:password@host:port`` alone
as httpx names a proxy -- so each of those is read here. Only what is cleaned changes: the
text around a URL, and a URL that holds nothing to leave out, stay as they were written (a
``%3d`` in a format string, a ``\\/`` in a regex, the punctuation after a URL).
"""

from __future__ import annotations

import re

_SLASHES = r"(?://|(?:\\+/){2}|(?:\\+u002[fF]){2}|(?:%(?:25)*2[fF]){2})"
"""A URL's ``//``: as written, escaped as JSON (``\\/``, doubled by ``repr``) or ``\\u002f``,
or percent-encoded (``%2F``, ``%252F``...)."""
_URL_START = re.compile(
    r"(?::|\\+u003[aA]|%(?:25)*3[aA])"
    + _SLASHES
    + r"|(?<![A-Za-z0-9_/:.\\%-])//"
    + r"|(?<![A-Za-z.+-])(?i:mailto|sips?|xmpp|im|pres):(?=[^\s@]*@)"
)
"""Where a URL's host (or user) begins: after ``:`` and its ``//`` in any of those forms (the
scheme before it is left as it is, whatever it is glued to: ``连接https://``, ``1https://``),
after a bare ``//`` that follows no ASCII word (nor ``/``: a path's ``/tmp//x``), or after a
scheme whose user comes without ``//`` (``mailto:user@host``). (A password holding ``//`` after
one of those may end its URL early: RFC 3986 has no ``/`` in a password.)"""
_URL_END = re.compile(r"[\s\"<>`\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff5b-\uff65]")
"""What ends a URL: a space, a quote or bracket that cannot be in one, CJK punctuation (not a
full-width letter: a password may hold one)."""
_HOST_START = re.compile(r"[\w~:-]|%[0-9A-Fa-f]{2}|\[[0-9A-Fa-f:]")
"""How what follows a URL's ``//`` begins: a host or user (an empty one: ``redis://:pw@h``) --
not a regex's ``([^/?#]+)`` or ``\\w+:\\w+@``, nor a format string's ``%s`` (outside testers
204, 205: they were cut as if they were URLs)."""
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-%")
"""What a scheme (or its percent-encoded ``:``) is written with (see ``_separated``)."""
_QUERY = re.compile(r"[?#]")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_ESCAPE = re.compile(r"\\+(?:/|u([0-9A-Fa-f]{4}))")
_USER_ALONE = re.compile(
    r"(?<![^\s'\"(<\[{=,;|`])[^\s:@/'\"()<>\[\]]+:[^\s'\"/]+@"
    r"(?=(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]+(?![\w.]))"
)
"""``user:password@host:port`` with no scheme or ``//`` (httpx's ``URL('user:pw@h:3128')`` for
a proxy written without one) -- a port after the host: ``npm:react@18.2.0``, ``Contact:bob@
example.com`` or ``python:3.12-slim@sha256:4c2c`` are no credentials (tester 204)."""
_PATH_QUERY = re.compile(
    r"(?<![^\s'\"(\[{=:,])((?:/|[\w.-]+(?::[0-9]+)?/)[^\s?#\"'<>]*)"
    r"\?([\w.~%-]+=[^\s\"<>]*)"
)
"""A path without a scheme (``url: /v1/chat?api-key=...``, as urllib3 writes it; or
``api.example.com/v1?key=...``) whose query string holds a value."""
_TRAILING = "'\".,;:!?)]}>"
"""What may follow a URL in prose and is not part of it."""


def without_credentials(text: str) -> str:
    """``text`` with every URL in it said without its user, password, query string and
    fragment."""
    out: list[str] = []
    at = 0
    starts = [m.span() for m in _URL_START.finditer(text)]
    starts = [(start, rest) for start, rest in starts if _HOST_START.match(text, rest)]
    for i, (start, rest) in enumerate(starts):
        if start < at:  # (inside the URL before it: its query's ``redirect=http://...``)
            continue
        ended = _URL_END.search(text, rest)
        end = ended.start() if ended else len(text)
        following = next((f for f, _ in starts[i + 1 :] if _separated(text, f)), end)
        query = _QUERY.search(text, rest, end)
        if following < (query.start() if query else end):  # the next URL starts first
            end = following
        out.append(text[at:start])
        out.append(_cleaned(text[start:rest], text[rest:end]))
        at = end
    out.append(text[at:])
    cleaned = _USER_ALONE.sub("", "".join(out))
    return _PATH_QUERY.sub(lambda m: m[1] + _given_back("?" + m[2]), cleaned)


def _separated(text: str, start: int) -> bool:
    """Whether the URL opening at ``start`` is one of its own -- its scheme after a space,
    quote, bracket or separator (``h1,http://...``) -- not part of the URL before it (an
    encoded ``%3A%2F%2F`` in its password: tester 204)."""
    at = start
    while at > 0 and text[at - 1] in _SCHEME_CHARS:
        at -= 1
    if at == 0:
        return True
    before = text[at - 1]
    # (a ``/``: a URL in another's path -- an archive's, a proxy's: tester 205)
    return before.isspace() or before in ",;|'\"()[]{}<>=`/" or not before.isascii()


def _cleaned(opening: str, rest: str) -> str:
    """A URL from its ``://`` (``opening``, as written) without what it must not show. An
    escaped or percent-encoded one is read as what it encodes, and said so, decoded, when
    something was left out; as written when nothing was (and a plain one is never decoded:
    ``%23`` in a password is part of the password, not a fragment)."""
    if opening in ("://", "//") or opening.endswith(":"):
        return opening + _kept(rest)
    decoded = _decoded(rest)
    kept = _kept(decoded)
    return opening + rest if kept == decoded else "://" + kept


def _decoded(rest: str) -> str:
    """``rest`` read as the URL it encodes: JSON-escaped, percent-encoded (up to thrice)."""
    text = rest
    for _ in range(3):
        unescaped = _ESCAPE.sub(lambda m: "/" if m[1] is None else chr(int(m[1], 16)), text)
        unescaped = _PERCENT.sub(lambda m: chr(int(m[1], 16)), unescaped)
        if unescaped == text:
            break
        text = unescaped
    return text


def _kept(rest: str) -> str:
    """What follows a URL's ``//`` (or ``mailto:``): its host and path, without the user and
    password before them or the query string and fragment after them -- and with what ended
    the sentence after it. The user and password end at the last ``@`` that follows them (a
    password may hold ``@``, and ``#`` or ``?`` where it was not encoded)."""
    at = rest.rfind("@")
    while at >= 0 and not _is_user(rest[:at]):
        at = rest.rfind("@", 0, at)
    if at >= 0:
        rest = rest[at + 1 :]
    query = _QUERY.search(rest)
    if query is None:
        return rest
    return rest[: query.start()] + _given_back(rest[query.start() :])


def _is_user(before: str) -> bool:
    """Whether ``before`` (what precedes an ``@`` in a URL) is a user and password: no ``/``
    before its first ``:``, or none at all -- not a path (``h/users/bob@x``) and not a host and
    port (``h:8080/x@y``)."""
    slash = before.find("/")
    if slash < 0:
        return True
    colon = before.find(":")
    if not 0 <= colon < slash:
        return False
    name = before[:colon]
    # digits after a host's name are its port; after a user's, its password (tester 204)
    is_host = "." in name or name == "localhost" or name.startswith("[")
    return not (is_host and before[colon + 1 : slash].isdigit())


def _given_back(dropped: str) -> str:
    """Of a query string or fragment that is dropped, the punctuation that ended the sentence
    after it (``(see http://h/a#b).`` keeps its ``).``; ``is it at http://h/v1?`` its ``?``)."""
    kept = dropped.rstrip(_TRAILING)
    return dropped[len(kept) :]
