"""Parse and re-serialise tool-result JSON exactly as OpenClaw (JavaScript) wrote it.

OpenClaw sends tool results as `JSON.stringify(payload, null, 2)`: 2-space indent, `": "`,
non-ASCII unescaped, and numbers in JavaScript's format (`0.000003618281867540916`, where
Python would write `3.618281867540916e-06`). A clamped result is written back the same way
(compact when it came compact), so only the clamped fields differ from what the agent sent.

>>> dumps_like({"a": [1, 0.000003618281867540916, 1e21, 1.5e-8]}, "{}")
'{"a":[1,0.000003618281867540916,1e+21,1.5e-8]}'
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import orjson

MAX_STRUCTURE = 32_768
"""JSON with more structure than this outside its strings (`bulky`) is left whole unparsed,
whatever the cap: every value costs the clamps' walks ~1 µs, each time (issue 35)."""
MAX_DEPTH = 128
"""JSON nested deeper is left whole: far below what orjson writes (254 levels) and Python's
stack (1,000) for the walks that write it back (recursive, like the JSON they walk)."""


def bulky(text: str, limit: int) -> bool:
    r"""Whether `text`, read as JSON, has over `limit` characters of structure outside its
    strings — two for each object or array, one for each comma: what writing it back takes
    whatever its strings are cut to, and a bound on its values (one more than that) — and
    nothing there but JSON's own tokens (a log that starts with `[` is text). C passes only:
    parsing 1 MB of `[[[…]]]` alone took 150 ms, walking its ~520,000 lists 500 ms.

    Brackets and commas inside strings are text and do not count:

    >>> bulky('[[[1]], {"a": 2}]', 8), bulky('[[[1]], {"a": 2}]', 9)
    (True, False)
    >>> bulky('{"log": "[[[[,,,,]]]]", "n": "\\"[["}', 3)
    False
    >>> bulky("[INFO] started, [WARN] slow, [INFO] done", 3)
    False
    """
    count = 2 * (text.count("[") + text.count("{")) + text.count(",")
    if count <= limit:
        return False  # counted inside strings too, and still under
    # every `"` left after the escaped backslashes and quotes opens or closes a string
    plain = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(plain.split('"')[::2])
    if 2 * (outside.count("[") + outside.count("{")) + outside.count(",") <= limit:
        return False
    words = outside.replace("true", "").replace("false", "").replace("null", "")
    return not words.translate(_TOKENS)


_TOKENS = str.maketrans(dict.fromkeys("[]{},: \t\n\r0123456789+-.eE"))
"""JSON's characters outside strings, deleted: what is left is not JSON."""


def loads(text: Any) -> Any:
    """Parse a JSON object; `None` when it does not parse, is not an object, or `text` is not
    a string at all (a client's `function.arguments` sent as an object: left as it came).

    >>> loads('{"url": "u"}'), loads({"url": "u"}), loads("[1]")
    ({'url': 'u'}, None, None)
    """
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # lone surrogates and huge integers: valid JSON orjson refuses
            value = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: past orjson's 1,024 levels
            return None
    return value if isinstance(value, dict) else None


def dumps_like(value: Any, original: str) -> str:
    """Serialise `value` in the layout of `original` (indented like JSON.stringify, or compact)."""
    numbers: dict[str, str] = {}
    value = _mark_floats(value, numbers)
    indented = original.lstrip().startswith(("{\n", "[\n"))
    try:
        out = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indented else 0).decode()
    except TypeError:
        if indented:
            out = json.dumps(value, indent=2, ensure_ascii=False)
        else:
            out = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for token, number in numbers.items():
        out = out.replace(json.dumps(token), number)
    return out


def js_number(value: float) -> str:
    """`value` as JavaScript's `Number.prototype.toString` writes it."""
    if not math.isfinite(value):
        return "null"  # what JSON.stringify writes for NaN and Infinity
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if 1e-7 <= abs(value) < 1e21:
        return format(Decimal(repr(value)), "f")
    mantissa, exponent = repr(value).split("e")
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"


def _mark_floats(value: Any, numbers: dict[str, str]) -> Any:
    # Floats whose Python form differs from JavaScript's go through as placeholder strings.
    if isinstance(value, float):
        text = js_number(value)
        if text == repr(value):
            return value
        token = f"\x00ctxbudget-number-{len(numbers)}\x00"
        numbers[token] = text
        return token
    if isinstance(value, dict):
        return {k: _mark_floats(v, numbers) for k, v in value.items()}
    if isinstance(value, list):
        return [_mark_floats(v, numbers) for v in value]
    return value
