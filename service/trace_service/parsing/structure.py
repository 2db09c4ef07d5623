"""The structure of a JSON body in time linear in its bytes, with no Python loop over them.

A request body that fails validation as a whole is split into its members and array elements, so that
each element is validated (and, for `/v1/expand`, rejected) on its own; a large body is split first so
that its validation is many short calls, none of which holds the interpreter for long.  Only the
structure is read: what an element holds, however malformed or deep, is that element's problem alone.

The scan is vectorised with numpy over the body's bytes:

* a ``"`` is escaped when an odd run of backslashes ends right before it; the unescaped ones alternate
  opening and closing strings (an odd count means a string never closes: no structure to read);
* a structural character (``{ } [ ] : ,``) counts when an even number of unescaped quotes precede it;
* the nesting depth after each structural character is the running sum of +1 (``{ [``) and −1
  (``} ]``), so a container opened at depth d closes at the first later token back at depth d.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: A span of the body: [start, end) byte offsets.
Span = tuple[int, int]

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("{"), ord("[")]] = 1
_OPEN[[ord("}"), ord("]")]] = -1
_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[[ord(c) for c in "{}[]:,"]] = True
_WHITESPACE = b" \t\n\r"


class TooManyElements(ValueError):
    """An array holds more elements than its reader takes (counted without reading them)."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"{count} elements, at most {limit} allowed")
        self.count = count
        self.limit = limit


class Structure:
    """The structural tokens of one body outside strings: their offsets, characters and depths."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        data = np.frombuffer(body, dtype=np.uint8)
        quotes = np.flatnonzero(data == _QUOTE)
        quotes = quotes[~_escaped(data, quotes)]
        self.balanced = quotes.size % 2 == 0
        self.strings = quotes.reshape(-1, 2) if self.balanced else np.zeros((0, 2), dtype=np.int64)
        # Inside a string: an odd number of unescaped quotes at or before the offset.
        opened = np.zeros(data.size, dtype=np.uint8)
        opened[quotes] = 1
        inside = np.bitwise_xor.accumulate(opened)
        tokens = np.flatnonzero(_STRUCTURAL[data] & (inside == 0))
        self.offsets: npt.NDArray[np.int64] = tokens
        self.chars: npt.NDArray[np.uint8] = data[tokens]
        # int64 throughout: numpy's native loop leaves the interpreter free (a cast to int32 on the way
        # holds it for a third of a second on 30 MB of brackets).
        self.depth: npt.NDArray[np.int64] = np.cumsum(_OPEN[self.chars].astype(np.int64))

    def _blank(self, start: int, end: int) -> bool:
        return not self.body[start:end].strip(_WHITESPACE)

    def _closing(self, token: int) -> int | None:
        """The index of the token that closes the container opened by token ``token``."""
        level = self.depth[token] - 1
        later = np.flatnonzero(self.depth[token + 1 :] == level)
        return None if not later.size else token + 1 + int(later[0])

    def _separators(self, first: int, close: int, chars: bytes) -> npt.NDArray[np.int64]:
        """Indices of the tokens among ``chars`` directly inside the container ``first``…``close``."""
        inner = slice(first + 1, close)
        mask = (self.depth[inner] == self.depth[first]) & np.isin(self.chars[inner], list(chars))
        return np.flatnonzero(mask) + first + 1

    def _string_at(self, start: int) -> Span | None:
        """The string starting at offset ``start`` (quotes included)."""
        row = int(np.searchsorted(self.strings[:, 0], start))
        if row < len(self.strings) and self.strings[row, 0] == start:
            return start, int(self.strings[row, 1]) + 1
        return None

    def _sole_string(self, start: int, end: int) -> bytes | None:
        """The raw text of the one string that [start, end) holds between whitespace, or None."""
        text = self.body[start:end]
        string = self._string_at(start + len(text) - len(text.lstrip(_WHITESPACE)))
        if string is None or not self._blank(string[1], end):
            return None
        return self.body[string[0] : string[1]]

    def object_members(self) -> dict[bytes, Span] | None:
        """The members of a body that is one JSON object: each key's raw text (quotes included) and
        its value's span; None when the body is not one object of distinct ``"key": value`` members
        (a value's own content is not checked)."""
        if not self.balanced or not self.offsets.size or self.chars[0] != ord("{"):
            return None
        close = self._closing(0)
        if close is None or self.chars[close] != ord("}"):
            return None
        if not self._blank(0, int(self.offsets[0])) or not self._blank(
            int(self.offsets[close]) + 1, len(self.body)
        ):
            return None
        separators = [0, *self._separators(0, close, b":,").tolist(), close]
        members: dict[bytes, Span] = {}
        if len(separators) == 2 and self._blank(int(self.offsets[0]) + 1, int(self.offsets[close])):
            return members  # {}
        # Members alternate "key" : value , "key" : value …
        for k in range(0, len(separators) - 1, 2):
            before, colon = separators[k], separators[k + 1]
            after = separators[k + 2] if k + 2 < len(separators) else None
            if after is None or self.chars[colon] != ord(":"):
                return None
            if self.chars[after] != ord(",") and after != close:
                return None
            key = self._sole_string(int(self.offsets[before]) + 1, int(self.offsets[colon]))
            if key is None or key in members:
                return None
            members[key] = (int(self.offsets[colon]) + 1, int(self.offsets[after]))
        return members

    def array_elements(self, span: Span, limit: int) -> list[Span] | None:
        """The elements of the JSON array that ``span`` holds (surrounding whitespace allowed); None
        when the span holds no array.  ``[]`` has none; ``[x,]`` has two (the last one blank, an error
        for whoever reads it).  Raises :class:`TooManyElements` past ``limit`` elements."""
        start, end = span
        if not self.balanced:
            return None
        first = int(np.searchsorted(self.offsets, start))
        if first >= self.offsets.size or self.chars[first] != ord("["):
            return None
        close = self._closing(first)
        if close is None or self.chars[close] != ord("]") or int(self.offsets[close]) >= end:
            return None
        if not self._blank(start, int(self.offsets[first])) or not self._blank(
            int(self.offsets[close]) + 1, end
        ):
            return None
        commas = self._separators(first, close, b",")
        if commas.size + 1 > limit:
            raise TooManyElements(commas.size + 1, limit)
        bounds = [int(self.offsets[first]), *self.offsets[commas].tolist(), int(self.offsets[close])]
        spans = [(bounds[i] + 1, bounds[i + 1]) for i in range(len(bounds) - 1)]
        if len(spans) == 1 and self._blank(*spans[0]):
            return []
        return spans


def _escaped(data: npt.NDArray[np.uint8], quotes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which quotes an odd run of backslashes ends right before.

    The runs are read as one integer's bits (simdjson's carry trick): adding a 1 at the first bit of
    every run that starts at an even offset carries through the run to the offset right after it,
    which is odd exactly when the run is; likewise for the runs that start at odd offsets.
    """
    slashes = data == _BACKSLASH
    if not slashes.any():
        return np.zeros(quotes.size, dtype=bool)
    size = (data.size + 8) // 8  # a spare byte: a run may end at the last offset
    bits = int.from_bytes(np.packbits(slashes, bitorder="little").tobytes(), "little")
    even = int.from_bytes(b"\x55" * size, "little")
    odd = even << 1
    starts = bits & ~(bits << 1)
    after_even = (bits + (starts & even)) & ~bits
    after_odd = (bits + (starts & odd)) & ~bits
    after_odd_run = (after_even & odd) | (after_odd & even)
    marks = np.unpackbits(
        np.frombuffer(after_odd_run.to_bytes(size + 1, "little"), dtype=np.uint8), bitorder="little"
    )
    return marks[quotes].astype(bool)
