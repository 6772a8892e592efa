from __future__ import annotations

import doctest
import json

import pytest

import proxy.wire.body
from proxy.errors import BadRequest
from proxy.wire.body import parse_chat_body


def test_doctests() -> None:
    assert doctest.testmod(proxy.wire.body).failed == 0


def test_unchanged_fields_are_spliced_back_byte_for_byte() -> None:
    raw = b'{"model":"m","tools":[{"x":1.0e5}],"messages":[{"role":"user","content":"a"}],"n":1}'
    body = parse_chat_body(raw)
    out = body.encode([{"role": "user", "content": "b"}])
    assert out == raw.replace(b'"a"', b'"b"')
    assert body.to_dict()["tools"] == [{"x": 100000.0}]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"messages": [], "tools": ["\xff"]}', "'tools' is not valid UTF-8"),
        (b'{"messages": ["\xff"]}', "not valid JSON"),
        (b'{"messages": [] } trailing', "not valid JSON"),
        (b'"just a string"', "must be a JSON object, got string"),
        (
            b'{"messages": {"role": "user"}}',
            "'messages' must be a list of chat messages, got object",
        ),
    ],
)
def test_malformed_bodies_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_chat_body(raw)


def test_valid_json_that_fast_parsers_refuse_still_works() -> None:
    raw = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "\ud800"}], "seed": 2**70}
    ).encode()
    body = parse_chat_body(raw)
    assert body.messages[0]["content"] == "\ud800"
    assert body.get("seed") == 2**70
    assert json.loads(body.encode(body.messages)) == json.loads(raw)
