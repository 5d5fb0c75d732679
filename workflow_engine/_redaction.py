"""Credentials out of text that people other than the operator read: errors, endpoints.

An error raised by a step -- a tool, a model client, a library under them -- may name a URL
whole: a model endpoint's user and password, an ``?api-key=...``. An AG-UI ``RUN_ERROR`` goes to
every client of the thread, so the server says such URLs without their user, password, query
string and fragment (its log keeps the text whole); the command line says a model endpoint so,
and a run records it so. The text is the exception's own, in whatever form the code that
raised it wrote the URL -- with or without a scheme, glued to the words before it, inside
quotes or brackets, several in a row, one in another's path, escaped as JSON or ``repr`` write
it, percent-encoded (once or twice) inside another URL, or ``user:password@host:port`` alone
as httpx names a proxy, or wrapped onto the next line where it goes on (``_continued``) --
so each of those is read here. The text is cleaned in pieces (``pieces``): its words, and the
lines a wrapped URL goes on across, so that the AG-UI server, which cleans a piece at a time
up to what it shows, says it as the whole is said. Only what is cleaned changes: the
text around a URL, and a URL that holds nothing to leave out, stay as they were written (a
``%3d`` in a format string, a ``\\/`` in a regex, the punctuation after a URL).

The text may be anyone's -- an error can quote what a client sent -- so it is read in time
linear in its length: no pattern scans on from every place it could start (a payload key of
``a:,a:,...`` held a server's loop 46 s, outside tester 207), and a scheme, a user and password
without one, or a ``mailto:`` user is read only so long (``_LONGEST``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_LONGEST = 128
"""The longest scheme, or user and password without a scheme, read as one: longer, it is
taken for a word (RFC 3986 sets no limit; none in use comes near)."""
_LINE_BREAKS = "\n\r\v\f\x85\u2028\u2029"
_SLASHES = r"(?://|(?:\\+/){2}|(?:\\+u002[fF]){2}|(?:%(?:25)*2[fF]){2})"
"""A URL's ``//``: as written, escaped as JSON (``\\/``, doubled by ``repr``) or ``\\u002f``,
or percent-encoded (``%2F``, ``%252F``...)."""
_URL_START = re.compile(
    r"(?::|(?<!\\)\\+u003[aA]|%(?:25)*3[aA])"
    + _SLASHES
    + r"|(?<![A-Za-z0-9_/:.\\%-])//"
    + rf"|(?<![A-Za-z.+-])(?i:mailto|sips?|xmpp|im|pres):(?=[^\s@]{{0,{_LONGEST}}}@)"
)
"""Where a URL's host (or user) begins: after ``:`` and its ``//`` in any of those forms (the
scheme before it is left as it is, whatever it is glued to: ``连接https://``, ``1https://``),
after a bare ``//`` that follows no ASCII word (nor ``/``: a path's ``/tmp//x``), or after a
scheme whose user comes without ``//`` (``mailto:user@host``). (A password holding ``//`` after
one of those may end its URL early: RFC 3986 has no ``/`` in a password.)"""
_URL_END = re.compile(r"[\s\"<>`\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff5b-\uff65]")
"""What ends a URL: a space, a quote or bracket that cannot be in one, CJK punctuation (not a
full-width letter: a password may hold one)."""
_HOST_START = re.compile(r"[\w~:-]|%[0-9A-Fa-f]{2}|\[[0-9A-Fa-f:]|\.\.\.|…")
"""How what follows a URL's ``//`` begins: a host or user (an empty one: ``redis://:pw@h``) --
not a regex's ``([^/?#]+)`` or ``\\w+:\\w+@``, nor a format string's ``%s`` (outside testers
204, 205: they were cut as if they were URLs)."""
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-%")
"""What a scheme (or its percent-encoded ``:``) is written with (see ``_separated``)."""
_QUERY = re.compile(r"[?#]")
_ENCODED_AT = re.compile(
    r".*(?:%(?:25)*40|\\+u0040|&(?:amp;)?(?:#0*64(?![0-9])|#[xX]0*40(?![0-9A-Fa-f])|commat);?)",
    re.DOTALL,
)  # (the last one; percent-encoded, JSON-escaped, or an HTML character reference)
_ENCODED_QUERY = re.compile(r"%(?:25)*(?:3[fF]|23)|\\+u00(?:3[fF]|23)")
_ELISION = re.compile(r"\.\.\.|…")
_SECRET_MARKER = re.compile(
    r"[?#=]|%(?:25)*(?:3[fFdD]|23)|\\+u00(?:3[fFdD]|23)"
)  # (written, percent-encoded or JSON-escaped)
_PYDANTIC_VALUE = re.compile(r"input_value=(?P<value>[^\n]{0,200}?)(?=, input_type=)")
_TOKENS = re.compile(r"\S+|\s+")
_QUOTED_ELIDED = re.compile(
    r"(?P<head>(?:(?P<open>['\"])[^'\"\s]*?|(?<!\S))(?:\.\.\.|…))(?P<tail>[^'\"\s]*)"
    r"(?=(?(open)(?P=open)|['\"]))"
)
"""A quoted value shortened with ``...`` or ``…`` between its ends, as pydantic quotes one."""
_HOST_AND_PORT = re.compile(r"(?:[\w.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_ESCAPE = re.compile(r"(?<!\\)\\+(?:/|u([0-9A-Fa-f]{4}))")
_WRAPPED = rf"(?:(?<=[-:])[^\S{_LINE_BREAKS}]*[{_LINE_BREAKS}]\s*|\s*[{_LINE_BREAKS}]\s*(?=[@-]))"
"""A line break a wrapper put in a user and password, or a proxy's host and port: after a
hyphen or a ``:``, or before the ``@`` or a hyphen (outside testers 220, 221: ``svc-user:
hunter-`` / ``prod@proxy:3128``; ``@egress-`` / ``proxy:8080``)."""
_USER_ALONE = re.compile(
    rf"(?<![^\s'\"(<\[{{=,;|`])(?:[^\s:@/'\"()<>\[\]]|{_WRAPPED}){{1,{_LONGEST}}}:"
    rf"(?:[^\s'\"/]|{_WRAPPED}){{1,{_LONGEST}}}@"
    rf"(?=(?:(?:[A-Za-z0-9.-]|{_WRAPPED}){{1,{_LONGEST}}}|\[[0-9A-Fa-f:.]+\]):(?:{_WRAPPED})?"
    r"[0-9]+(?!\w|\.\w))"  # (a sentence's . may end it)
)
"""``user:password@host:port`` with no scheme or ``//`` (httpx's ``URL('user:pw@h:3128')`` for
a proxy written without one) -- a port after the host: ``npm:react@18.2.0``, ``Contact:bob@
example.com`` or ``python:3.12-slim@sha256:4c2c`` are no credentials (tester 204)."""
_QUERY_KEY = re.compile(
    rf"&[\w.~%-]+=|\?[\w.~%-]*(?:=|(?=[^\S{_LINE_BREAKS}]*[{_LINE_BREAKS}]\s*[^\s=]*=))"
)
"""A query string that holds a value, after a path without a scheme (``url: /v1/chat?api-key=
...``, as urllib3 writes it; or ``api.example.com/v1?key=...``): see ``_paths_without_queries``."""
_PATH_STOP = frozenset("?#\"'<>")
"""What a path without a scheme does not hold, besides white space."""
_PATH_AFTER = frozenset("'\"([{=:,")
"""What such a path follows, besides white space, if anything."""
_PATH_OPENING = re.compile(r"/|[\w.-]+(?::[0-9]+)?/")
_VALUE_END = re.compile(r"[\s\"<>]")
_SPACE = re.compile(r"\s+")
_BREAK = re.compile(f"[{_LINE_BREAKS}]")
"""A line break, in any of the forms ``str.splitlines`` knows."""
_OPEN_KEY = re.compile(r"[?&][\w.~%-]*\Z")
"""A query string's key that a line break follows (``_QUERY_KEY`` reads one as a key)."""
_ENCODED_MARK_END = re.compile(r"(?:%(?:25)*(?:3[fFdD]|26|23)|\\+u00(?:3[fFdD]|26|23))\Z")
"""An encoded ``?``, ``=``, ``&`` or ``#`` that ends a line."""
_OPENING = "([{<'\""
"""What may open a word before a query string that stands alone (``(?token=...)``)."""
_GOES_ON = frozenset("?&=#")
"""How a line ends inside a query string (or a fragment) that the next line goes on with:
after its ``?``, an ``&``, an ``=`` or its ``#`` -- written or encoded."""
_JOINED = frozenset("?&=#-:")
"""What ``pieces`` joins a line to the next after: all that ``_continued`` goes on after."""
_TRAILING = "'\".,;:!?)]}>"
"""What may follow a URL in prose and is not part of it."""


def without_credentials(text: str) -> str:
    """``text`` with every URL in it said without its user, password, query string and
    fragment. Cleaned a piece at a time (``pieces``), so that cleaning it whole and a piece
    at a time, as the AG-UI server does (``cleaned_piece``), say it alike."""
    text = shortened_values_cleaned(text)
    return "".join(p if p.isspace() else cleaned_piece(p) for p, _ in pieces(text))


def cleaned_piece(text: str) -> str:
    """One of ``pieces``, shortened values cleaned already, as ``without_credentials`` says
    it."""
    out: list[str] = []
    at = 0
    starts = [m.span() for m in _URL_START.finditer(text)]
    starts = [(start, rest) for start, rest in starts if _HOST_START.match(text, rest)]
    # where the next URL of its own opens, after each start (or the text's end)
    following = [len(text)] * len(starts)
    for i in range(len(starts) - 1, 0, -1):
        following[i - 1] = starts[i][0] if _separated(text, starts[i][0]) else following[i]
    for i, (start, rest) in enumerate(starts):
        if start < at:  # (inside the URL before it: its query's ``redirect=http://...``)
            continue
        ended = _URL_END.search(text, rest, following[i])
        end = ended.start() if ended else following[i]
        if ended is None and _QUERY.search(text, rest, end):
            # the next URL is in this one's query (``redirect=http://...``): it goes on
            ended = _URL_END.search(text, end)
            end = ended.start() if ended else len(text)
        query = bool(_QUERY.search(text, rest, end) or _ENCODED_QUERY.search(text, rest, end))
        end = _continued(text, end, following[i], query=query, url=True)
        out.append(text[at:start])
        out.append(_cleaned(text[start:rest], text[rest:end]))
        at = end
    out.append(text[at:])
    return _elided_tails(_paths_without_queries(_USER_ALONE.sub("", "".join(out))))


def _elided_tails(text: str) -> str:
    """``text`` without what may be secret in the ends of quoted values a library shortened
    (pydantic quotes a long value as its first and last characters with ``...`` between): cut
    before a URL's ``//``, the end left holds no URL to clean, but may hold the rest of a
    password before its ``@``, a query string or a fragment (outside testers 210, 211). Those
    are left out. Only in a quoted value, or one whose opening quote the cut took (a dict's
    ``'url': ...pi-key=KEY'``): ``Retrying...attempt=3`` in prose is no URL's."""
    return _QUOTED_ELIDED.sub(_without_secret_ends, text)


def _without_secret_ends(quoted: re.Match[str]) -> str:
    return quoted["head"] + _secret_end_left_out(quoted["tail"])


def _secret_end_left_out(tail: str) -> str:
    """The end of a value shortened before it, without what may be a password's end (before
    an ``@``) or a query string's or fragment's (from a ``?``, ``#`` or ``=``, written or
    encoded; an ``=`` stays) -- and with what closed the value after it."""
    tail = tail[tail.rfind("@") + 1 :]  # (a password's end, its @; the host after it stays)
    marker = _SECRET_MARKER.search(tail)
    if marker is None:
        return tail
    kept = marker.end() if marker.group() == "=" else marker.start()
    return tail[:kept] + _given_back(tail[kept:])


def shortened_values_cleaned(text: str) -> str:
    """``text`` with the end of each value pydantic shortened in a validation error
    (``input_value=<its first characters>...<its last>, input_type=``) said without what may
    be secret there (``_secret_end_left_out``): the cut may have taken the URL's scheme and
    host, and the sentence around it, so nothing else marks it (outside tester 212). Works on
    the whole text: a shortened value may hold white space."""
    return _PYDANTIC_VALUE.sub(_value_without_secret_end, text)


def _value_without_secret_end(found: re.Match[str]) -> str:
    value = found["value"]
    elided = _ELISION.search(value)
    if elided is None:
        return found.group()
    kept = value[: elided.end()] + _secret_end_left_out(value[elided.end() :])
    return found.group()[: found.start("value") - found.start()] + kept


def _paths_without_queries(text: str) -> str:
    """``text`` with the query string after each path without a scheme left out (see
    ``_QUERY_KEY``). Read from each query back to its path, so that no place is read twice."""
    out: list[str] = []
    at = search = 0
    while (query := _QUERY_KEY.search(text, search)) is not None:
        q = query.start()
        # a query string at the start of a word (after an opening bracket or quote, if any):
        # its path is on the line before it (a library wrapped a long URL there), or it stands
        # alone -- either way it is left out; an ``&`` opens one only there
        if text[q] == "&":  # (not read back to its word's start: "a&=&=&=..." was quadratic)
            begin = q
            while begin > at and text[begin - 1] in _OPENING:
                begin -= 1
            if begin > at and not text[begin - 1].isspace() and text[begin - 1] not in _PATH_STOP:
                search = q + 1
                continue
        else:
            begin = q  # the path runs back to white space, a quote or another query
            while (
                begin > at and text[begin - 1] not in _PATH_STOP and not text[begin - 1].isspace()
            ):
                begin -= 1
            alone = not text[begin:q].lstrip(_OPENING)
            if not alone and _path_opening(text, begin, q) is None:
                search = q + 1
                continue
        ended = _VALUE_END.search(text, query.end())
        end = _continued(
            text, ended.start() if ended else len(text), len(text), query=True, url=False
        )
        out.append(text[at:q])
        out.append(_given_back(text[q:end]))
        at = search = end
    out.append(text[at:])
    return "".join(out)


def _continued(text: str, end: int, limit: int, *, query: bool, url: bool) -> int:
    """Where a URL (``url``) or a path's query string (``query``: one is open) that ends at
    ``end`` -- at white space -- really ends, before ``limit`` (the next URL of its own): a
    line break a library wrapped it at is no end when the line ends inside a query string
    (``_GOES_ON``), at a hyphen a wrapper broke a word at, or -- in a URL -- after the ``:``
    of a user's password, or when the next line goes on with an ``&`` (or a password's end,
    an ``@``). It then ends where that line's first word does (outside testers 217, 218:
    wrapped keys and passwords went to the client). ``pieces`` keeps such lines together.
    A URL's open query string runs over ``limit``: a URL in it (``?next=https://...``) is
    part of its value (outside tester 220)."""
    while True:
        bound = len(text) if url and query else limit
        if end >= bound:
            break
        space = _SPACE.match(text, end)
        if space is None or _BREAK.search(space.group()) is None:
            break
        after = space.end()
        if after >= bound:
            break
        last, first = text[end - 1], text[after]
        ended = (_URL_END if url else _VALUE_END).search(text, after, bound)
        stop = ended.start() if ended else bound
        pair = "=" in text[after:stop]  # (the next line's word is a key and its value)
        goes_on = (
            last in "-="
            or (first == "&" and pair)
            or (first == "-" and stop - after > 1)  # (textwrap breaks before a "--")
            or (query and pair and (last in _GOES_ON or _ended_encoded(text, end)))
            or (url and ((last == ":" and "@" in text[after:stop]) or first == "@"))
        )
        if not goes_on:
            break
        end = stop
        query = query or bool(
            _QUERY.search(text, after, end) or _ENCODED_QUERY.search(text, after, end)
        )
    return end


def _ended_encoded(text: str, end: int) -> bool:
    """Whether ``text`` has an encoded ``?``, ``=``, ``&`` or ``#`` just before ``end``."""
    return _ENCODED_MARK_END.search(text, max(0, end - 16), end) is not None


def pieces(text: str, longest: int | None = None) -> Iterator[tuple[str, int]]:
    """``text`` as the pieces it is cleaned in (``cleaned_piece``), each with where it ends:
    its runs of white space, and its words -- those a URL or a query string goes on across a
    line break in (see ``_continued``) kept together, and more (a line ending in a hyphen),
    which clean the same together as apart. ``longest``: a piece of lines running on that
    grows past it is given as far as it got, and nothing after it (a reader that stops at a
    piece that long reads no more: 6 MB of ``x-`` lines held a server's loop, tester 218)."""
    parts: list[str] = []  # the piece being gathered: words and the white space between
    size = end = 0
    space: tuple[str, int] | None = None  # white space after it, not yet given
    for token in _TOKENS.finditer(text):
        chunk = token.group()
        if chunk.isspace():
            if parts:
                space = (chunk, token.end())
            else:
                yield chunk, token.end()
            continue
        if parts and space is not None and _goes_on(parts[-1], space[0], chunk):
            parts += [space[0], chunk]
            size += len(space[0]) + len(chunk)
            if longest is not None and size > longest:
                yield "".join(parts), token.end()
                return
        else:
            if parts:
                yield "".join(parts), end
                if space is not None:
                    yield space
            parts, size = [chunk], len(chunk)
        end, space = token.end(), None
    if parts:
        yield "".join(parts), end
    if space is not None:
        yield space


def _goes_on(before: str, space: str, word: str) -> bool:
    """Whether ``word`` may go on with a URL or query string ``before`` left open across
    ``space`` (see ``_continued``; more often than it does, which cleans the same)."""
    return _BREAK.search(space) is not None and (
        before[-1] in _JOINED
        or word[0] in "&@-"
        or _ended_encoded(before, len(before))
        or _OPEN_KEY.search(before, max(0, len(before) - _LONGEST)) is not None
    )


def _path_opening(text: str, begin: int, query: int) -> int | None:
    """Where the path that ends at ``query`` opens -- the first place in ``text[begin:query]``
    after nothing or one of ``_PATH_AFTER`` that opens as a path -- or None."""
    for place in range(begin, query):
        if place > 0 and text[place - 1] not in _PATH_AFTER and not text[place - 1].isspace():
            continue
        if _PATH_OPENING.match(text, place, query):
            return place
    return None


def _separated(text: str, start: int) -> bool:
    """Whether the URL opening at ``start`` is one of its own -- its scheme after a space,
    quote, bracket or separator (``h1,http://...``) -- not part of the URL before it (an
    encoded ``%3A%2F%2F`` in its password: tester 204)."""
    at = start
    while at > 0 and text[at - 1] in _SCHEME_CHARS:
        at -= 1
        if start - at > _LONGEST:
            return False  # a word, not a scheme
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
    elided = _ELISION.search(rest)
    if elided is not None:
        return _kept_of_elided(rest, elided.start(), elided.group())
    at = rest.rfind("@")
    slash = rest.find("/")
    if 0 <= slash < at and not _is_user(rest[:at]):  # (so is every ``@`` after that ``/``)
        at = rest.rfind("@", 0, slash)
    if at >= 0:
        rest = rest[at + 1 :]
    elif (encoded := _ENCODED_AT.search(rest, 0, slash if slash >= 0 else len(rest))) is not None:
        # an @ written only encoded, before the path: ``quote(url, safe=":/")`` wrote it so
        # (a password's own ``%40`` has a plain ``@`` after it -- outside tester 209)
        rest = rest[encoded.end() :]
    # the first ? or #, written or encoded (an encoded ? before a plain # showed the query
    # string: outside tester 211)
    found = [m.start() for m in (_QUERY.search(rest), _ENCODED_QUERY.search(rest)) if m]
    if not found:
        return rest
    return rest[: min(found)] + _given_back(rest[min(found) :])


def _kept_of_elided(rest: str, at: int, mark: str) -> str:
    """``_kept`` of a URL a library shortened, ``mark`` at ``at`` (pydantic quotes a long value
    as its first and last characters with ``...`` between): what is left before the cut may be
    a user and password whose ``@`` was cut, and what is left after it the end of a query
    string whose ``?`` was (outside tester 209). The host and path before the cut are said
    when they are whole -- a ``/`` after a host, and a port, if any, of digits -- or a host
    alone; nothing after the cut."""
    kept = _kept(rest[:at])
    host, slash, _ = kept.partition("/")
    if not _HOST_AND_PORT.fullmatch(host) or not (slash or ("." in host and ":" not in host)):
        kept = ""
    return kept + mark + _given_back(rest[at + len(mark) :])


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
