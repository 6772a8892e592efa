"""Text measured the way OpenClaw measures it: UTF-16 code units (JavaScript `.length`).

Python's `len()` counts code points; a character outside the Basic Multilingual Plane (most
emoji, some CJK) is one code point but two UTF-16 code units. Caps are set in OpenClaw's unit,
so every measurement and every cut here uses UTF-16 units, and a cut never splits a surrogate
pair: a result is never longer than its cap in either unit. A lone surrogate (valid in a JSON
string as an escape, and in a JavaScript string) is one unit, as JavaScript counts it.

>>> utf16_len("abc"), utf16_len("a\U0001f600")
(3, 3)
>>> utf16_head("a\U0001f600b", 2)    # the emoji needs 2 units; only 1 is left after "a"
'a'
>>> utf16_tail("a\U0001f600b", 3)
'\U0001f600b'
>>> utf16_len("\\ud800\\U0001f600"), utf16_head("\\ud800\\U0001f600", 2) == "\\ud800"
(3, True)
"""

from __future__ import annotations


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _astral(text: str) -> bool:
    # Only astral characters (>= U+10000) make UTF-16 and code-point lengths differ.
    return not text.isascii() and len(text.encode("utf-16-le", "surrogatepass")) // 2 != len(text)


def utf16_head(text: str, units: int) -> str:
    """The longest prefix of `text` that fits in `units` UTF-16 code units."""
    if units <= 0:
        return ""
    if not _astral(text):
        return text[:units]
    used = 0
    for i, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            return text[:i]
    return text


def utf16_tail(text: str, units: int) -> str:
    """The longest suffix of `text` that fits in `units` UTF-16 code units."""
    if units <= 0:
        return ""
    if not _astral(text):
        return text[-units:] if units < len(text) else text
    used = 0
    for i in range(len(text) - 1, -1, -1):
        used += 2 if ord(text[i]) > 0xFFFF else 1
        if used > units:
            return text[i + 1 :]
    return text
