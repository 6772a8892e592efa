from __future__ import annotations

import doctest
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctxbudget.proxy.wire.body
from ctxbudget.proxy.errors import BadRequest
from ctxbudget.proxy.wire.body import TAILS, parse_chat_body, parse_object
from tests.fakes import chat_completion
from tests.inproc import proxy_app
from tests.openclaw import openclaw_request


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.proxy.wire.body).failed == 0


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


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
_FRESH = itertools.count()
# ~27 KB: long enough to be remembered
TOOLS = json.dumps([{"name": f"tool{i}", "description": "é" * 40} for i in range(300)])


def _full(raw: bytes) -> dict[str, bytes] | str:
    """What a scan of the whole body gives (no tail remembered): fields, or the error."""
    try:
        body = parse_object(raw, example="x", owner=f"fresh-{next(_FRESH)}")
    except BadRequest as exc:
        return exc.message
    return {k: bytes(v) if not body._decoded else v for k, v in body._fields.items()}


@given(
    st.lists(_JSON, max_size=4),
    st.sampled_from(["", " ", "\n  "]),
    st.sampled_from([b"", b"}", b'"', b"\xff", b"[", b",1"]),
)
def test_a_remembered_tail_reads_every_body_as_a_whole_scan_does(
    messages: list[object], space: str, junk: bytes
) -> None:
    # one turn, then the next with more messages and the same tools after them
    first = f'{{"model": "m", "messages": [],{space}"tools": {TOOLS}, "n": 1}}'.encode()
    parse_object(first, example="x", owner="o")
    grown = json.dumps(messages).encode()
    hit = f'{{"model": "m", "messages": {grown.decode()},{space}"tools": {TOOLS}, "n": 1}}'
    assert TAILS.fields(hit.encode(), "o") is not None  # read from the remembered tail
    for raw in (
        f'{{"model": "m", "messages": {grown.decode()},{space}"tools": {TOOLS}, "n": 1}}'.encode(),
        # the same ending after something that is not a member boundary, or not JSON
        b'{"model": "m", "x": ' + junk + first[first.index(b", ", 20) :],
        b'{"messages": [' + junk + first[first.index(b"],") + 1 :],
    ):
        # the offload's count of objects (a remembered tail's counted once) is a whole count
        assert TAILS.structure(raw, "o") == raw.count(b"{") + raw.count(b"[")
        try:
            found = parse_object(raw, example="x", owner="o")
        except BadRequest as exc:
            assert _full(raw) == exc.message
        else:
            fields = {k: bytes(v) if not found._decoded else v for k, v in found._fields.items()}
            assert fields == _full(raw)


def test_the_tail_of_one_owner_is_not_another_owners() -> None:
    first = f'{{"messages": [], "tools": {TOOLS}}}'.encode()
    parse_object(first, example="x", owner="alice")
    later = f'{{"messages": [1], "tools": {TOOLS}}}'.encode()
    assert TAILS.fields(later, "alice") is not None
    assert TAILS.fields(later, "bob") is None


# -- numbers written back as the client wrote them (issue 24) --------------------------------


def test_messages_the_proxy_did_not_change_go_on_as_the_client_wrote_them(tmp_path: Path) -> None:
    # re-serialised, 1E2 became 100.0, and 1e999 null (orjson) or Infinity (not JSON)
    body = openclaw_request(stream=False)
    body["messages"][1]["n"] = "N"
    raw = json.dumps(body).replace('"N"', "[1E2, 1e999, -1e999, 1.50]").encode()
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion())
        r = client.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200
    assert int(r.headers["x-context-budget-clamped"]) >= 3  # other messages did change
    sent = fake.last.body or b""
    untouched = json.dumps(body["messages"][1]).replace('"N"', "[1E2, 1e999, -1e999, 1.50]")
    assert untouched.encode() in sent
    assert b"Infinity" not in sent and b"NaN" not in sent


def test_a_number_no_float_holds_is_never_written_as_infinity() -> None:
    # a lone surrogate makes the whole body go through the stdlib parser: no raw bytes to
    # keep, so such a number cannot be written back: a 400, never `Infinity`
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800", "n": 1e999}]}'
    with pytest.raises(BadRequest, match=re.escape("a number beyond a 64-bit float (like 1e999)")):
        parse_chat_body(raw)
    body = parse_chat_body(raw.replace(b"1e999", b"1E2"))
    assert body.encode([*body.messages, {"role": "user", "content": "x"}]).count(b"100.0") == 1


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json(constant: bytes) -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800", "n": X}]}'
    with pytest.raises(BadRequest, match="request body is not valid JSON"):
        parse_chat_body(raw.replace(b"X", constant))
    with pytest.raises(BadRequest, match="request body is not valid JSON"):
        parse_chat_body(raw.replace(b"\\ud800", b"a").replace(b"X", constant))


def test_a_number_no_float_holds_in_a_changed_message_is_a_400_not_null() -> None:
    body = parse_chat_body(b'{"model": "m", "messages": [{"role": "user", "n": [1e999, 2]}]}')
    with pytest.raises(BadRequest, match=re.escape("a number beyond a 64-bit float")):
        body.encode([{**body.messages[0], "content": "x"}])
    unchanged = body.encode([*body.messages, {"role": "user", "content": "x"}])
    assert b'[{"role": "user", "n": [1e999, 2]},{"role":"user"' in unchanged


def test_invalid_utf8_in_a_key_is_a_400_not_a_500() -> None:
    for raw in (b'{"model":"m","\xff":1,"messages":[]}', b'{"model":"m","messages":[{"\xfe":1}]}'):
        with pytest.raises(BadRequest, match="UTF-8"):
            parse_chat_body(raw)


def test_a_changed_list_is_written_with_the_unchanged_items_as_sent() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"1E2"},{"a":1}],"n":1}'
    body = parse_chat_body(raw)
    first, second = body.messages
    new = {"role": "user", "content": "new"}
    assert body.encode([]) == b'{"model":"m","messages":[],"n":1}'
    one = b'{"model":"m","messages":[{"role":"user","content":"1E2"}],"n":1}'
    assert body.encode([first]) == one
    assert body.encode([new, second, first]) == (
        b'{"model":"m","messages":[{"role":"user","content":"new"},{"a":1},'
        b'{"role":"user","content":"1E2"}],"n":1}'
    )
