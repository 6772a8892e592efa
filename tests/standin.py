"""A stand-in upstream LLM on 127.0.0.1 that speaks the exact wire of OpenAI Chat Completions,
Anthropic Messages and OpenAI Responses.

The only stand-in in the test suite: the proxy in front of it is the real one. Behaviour can be
driven by an `x_standin` object in the request body, which the proxy forwards untouched as an
unknown field:

    {"status": 429, "retry_after": "7"}   answer with that error status
    {"delay": 2.0}                        wait before answering (timeouts)
    {"chunks": 5, "chunk_delay": 0.3}     SSE pacing
    {"endless": true}                     stream until the client goes away
    {"tool_calls": true}                  answer with a tool call (chat completions: web_fetch)
    {"tool_calls": false}                 answer with text even when tools are offered

Real agents (OpenClaw, Claude Code, Codex) cannot send such a field, so `/v1/messages` and
`/v1/responses` also play a scripted tool turn with no control at all: a request that offers
tools and whose newest turn holds no tool result yet is answered with one tool call; a request
whose newest turn holds a tool result is answered with text that names the tool
("standin: done after tool read; result had 42 chars"). `StandIn.script_tool`,
`tool_preference` and `tool_inputs` choose the call; `call_tools = False` turns scripting off.

Usage is billed as the provider would, so that the proxy's report can be checked to the
token: the prompt is a run of blocks (tools, system blocks, messages or items), each counted
with tiktoken's o200k_base over its canonical JSON (`tokens_of`), and each provider's prompt
caching is played over them exactly as documented (`tests/prompt_cache.py`: Anthropic's
breakpoints, minimums, lookback and 5-minute / 1-hour lifetimes; OpenAI's automatic caching
from 1,024 tokens in 128-token steps, its retention and `prompt_cache_key` routing). Time is
the stand-in's `clock`, a `SimClock` that only `advance` (or `POST /_standin/clock`) moves:
a benchmark inserts idle gaps without sleeping. Each answer is priced from litellm's offline
map (`bills`, `bill()`, `GET /_standin/bill`).

In a test: `with run_standin() as s: ... s.base_url ... s.received`. As a process (for the
benchmarks): `python -m tests.standin --port 0` prints `STANDIN_PORT=<port>`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.prompt_cache import (
    ANTHROPIC_MAX_BREAKPOINTS,
    AnthropicCache,
    BillLine,
    OpenAICache,
    PromptUsage,
    SimClock,
    bill_summary,
    block_prefixes,
    marker_ttl,
    price,
    rates,
    tokens_of,
)

DEFAULT_TOOL_PREFERENCE = ("read", "Read", "read_file", "shell", "exec_command", "web_fetch")
"""Tool names a scripted turn calls, first offered wins (OpenClaw, Claude Code, Codex, …)."""


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""
    """The query string without its `?` (Claude Code posts to `/v1/messages?beta=true`)."""
    sent: bytes | None = None
    """The streamed answer's body exactly as sent, once it has all gone (what a relay must
    pass on byte for byte); None for a JSON answer."""

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class PlannedTurn:
    """One answer a `Planner` chose: a tool call `(name, input)` after a line of `text`, or
    (no call) `text` alone."""

    text: str
    call: tuple[str, dict[str, Any]] | None = None


Planner = Callable[[str, dict[str, Any], list[Any]], PlannedTurn | None]
"""Chooses the answer to a request: `(format, body, conversation)` → a turn, or None for the
stand-in's own. `format` is "chat", "messages" or "responses"; `conversation` is the
request's messages, or for Responses every input item (a continuation's earlier ones too)."""


@dataclass
class StoredResponse:
    """A Responses answer kept for `previous_response_id`: the whole conversation it answered
    (earlier turns included) and the items it produced."""

    input: list[Any]
    output: list[Any]


class StandIn:
    """State of a running stand-in: what it received, what became of its streams, and how it
    scripts tool turns on `/v1/messages` and `/v1/responses`."""

    def __init__(self, *, record: bool = True) -> None:
        self.record = record
        self.received: list[Received] = []
        self.streams_completed = 0
        self.streams_cancelled = 0
        self.port = 0
        self.replies: dict[str, str] = {}
        """Model name → the assistant text to answer it with (default: a received-count line,
        or on Messages/Responses after a tool result, a "done after tool" line)."""
        self.responses: dict[str, StoredResponse] = {}
        """Responses answers by id, for `previous_response_id` (not kept with `store: false`)."""
        self.clock = SimClock()
        """Simulated time for the prompt caches: moves only when told (`clock.advance`)."""
        self.anthropic_cache = AnthropicCache(self.clock)
        self.openai_cache = OpenAICache(self.clock)
        self.billed: list[dict[str, Any]] = []
        """The usage of each answer, in its format's own fields, in order."""
        self.bills: list[BillLine] = []
        """Each answer as the provider bills it (tokens by class, USD), in order."""
        self.call_tools = True
        """Answer a Messages/Responses request that offers tools, and holds no tool result in
        its newest turn, with a tool call. False: always text (unless `x_standin` says so)."""
        self.script_tool: tuple[str, dict[str, Any]] | None = None
        """The exact call a scripted turn makes, `(name, input)`, offered or not; None: choose
        by `tool_preference` among the tools the request offers."""
        self.tool_preference: list[str] = list(DEFAULT_TOOL_PREFERENCE)
        """Tool names tried in order; none offered: the request's first tool."""
        self.tool_inputs: dict[str, dict[str, Any]] = {}
        """Tool name → its call's input; absent: made from the tool's JSON schema (required
        properties only: paths "README.md", commands "echo standin", urls, numbers 1, …)."""
        self.planner: Planner | None = None
        """Plays a whole session: asked first on every format (an `x_standin` control
        aside); None, or its None: the scripting above."""
        self.script: list[tuple[str, dict[str, Any]]] = []
        """Calls to make one after another, `(name, input)`: each request that offers tools
        takes the next, whether its newest turn holds a tool result or not (a session of
        several tool turns). Empty: the one-call rule above."""
        self.server_tool = False
        """On Messages, a scripted call's answer starts with a web search the server ran
        itself (`server_tool_use` + `web_search_tool_result`), as Anthropic's server tools
        answer: a client replays those blocks in its next request."""

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def anthropic_api_base(self) -> str:
        """What litellm takes as `api_base` for Anthropic (it posts to `<base>/v1/messages`)."""
        return self.root

    @property
    def last_json(self) -> Any:
        return self.received[-1].json

    def bill(self) -> dict[str, Any]:
        """What the provider would bill for everything answered since the last reset: each
        request (`BillLine.to_dict`) and the totals (`tokens` by class, `usd`)."""
        lines = list(self.bills)
        return {**bill_summary(lines), "lines": [line.to_dict() for line in lines]}

    def charge(
        self, route: str, model: str, usage: PromptUsage, output: int, *, provider: str
    ) -> None:
        """Add one answer to `bills`, priced from litellm's map for `model`."""
        found = rates(model, "anthropic" if provider == "anthropic" else "openai")
        self.bills.append(
            BillLine(
                route=route,
                model=model,
                at=self.clock.now(),
                input=usage.input,
                cache_read=usage.cache_read,
                cache_write_5m=usage.cache_write_5m,
                cache_write_1h=usage.cache_write_1h,
                output=output,
                usd=None if found is None else price(found, usage, output),
            )
        )

    def reset(self) -> None:
        """Forget everything received and stored, and put scripting back to its defaults."""
        self.received.clear()
        self.replies.clear()
        self.responses.clear()
        self.anthropic_cache.clear()
        self.openai_cache.clear()
        self.billed.clear()
        self.bills.clear()
        self.call_tools = True
        self.script_tool = None
        self.tool_preference = list(DEFAULT_TOOL_PREFERENCE)
        self.tool_inputs = {}
        self.planner = None
        self.script = []
        self.server_tool = False


def _error(status: int, message: str, retry_after: str | None = None) -> Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    body = {"error": {"message": message, "type": "standin_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def _openai_error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _anthropic_error(
    status: int, kind: str, message: str, retry_after: str | None = None
) -> Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}},
        status_code=status,
        headers=headers,
    )


def create_standin(state: StandIn) -> Starlette:
    async def record(request: Request) -> tuple[bytes, Any]:
        body = await request.body()
        if state.record:
            received = Received(
                request.method, request.url.path, dict(request.headers), body, request.url.query
            )
            state.received.append(received)
            request.state.received = received
        try:
            return body, json.loads(body) if body else None
        except ValueError:
            return body, None

    def counted(
        events: AsyncGenerator[bytes, None], request: Request | None = None
    ) -> AsyncIterator[bytes]:
        """`events`, counted in `streams_completed` or `streams_cancelled` when it ends, and
        kept in the request's `Received.sent`."""
        received = getattr(request.state, "received", None) if request is not None else None

        async def wrapper() -> AsyncIterator[bytes]:
            done = False
            sent: list[bytes] = []
            try:
                async for event in events:
                    sent.append(event)
                    yield event
                done = True
            finally:
                await events.aclose()
                if done:
                    state.streams_completed += 1
                    if received is not None:
                        received.sent = b"".join(sent)
                else:
                    state.streams_cancelled += 1

        return wrapper()

    async def chat(request: Request) -> Response:
        _, data = await record(request)
        if not isinstance(data, dict):
            return _error(400, "body is not a JSON object")
        control = data.get("x_standin") or {}
        await asyncio.sleep(float(control.get("delay", 0)))
        if control.get("status"):
            return _error(int(control["status"]), "standin error", control.get("retry_after"))
        model = data.get("model", "standin")
        text = state.replies.get(
            str(model), f"standin: received {len(data.get('messages') or [])} messages"
        )
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        call = _tool_call() if control.get("tool_calls") else None
        plan = _plan(state, "chat", data, list(data.get("messages") or []), control)
        if plan is not None:
            text = plan.text
            if plan.call is not None:
                name, arguments = plan.call
                call = {
                    "id": "call_" + uuid.uuid4().hex[:24],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
        tool = call is not None
        parts = [("tool", t) for t in data.get("tools") or []]
        parts += [("message", m) for m in data.get("messages") or []]
        prompt = _openai_prompt(state, data, parts)
        # the model's tokens: the text and the call's name and arguments (not the id the API
        # gives it, a random one: the same answer always costs the same)
        function = call["function"] if call else {"name": "", "arguments": ""}
        completion = tokens_of(text) + tokens_of(function["name"] + function["arguments"])
        usage = {
            "prompt_tokens": prompt.total,
            "completion_tokens": completion,
            "total_tokens": prompt.total + completion,
            "prompt_tokens_details": {"cached_tokens": prompt.cache_read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
        state.billed.append(usage)
        state.charge("/v1/chat/completions", str(model), prompt, completion, provider="openai")
        if not data.get("stream"):
            said = (text or None) if plan is not None else None
            message: dict[str, Any] = {"role": "assistant", "content": said if tool else text}
            if call is not None:
                message["tool_calls"] = [call]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "logprobs": None,
                            "finish_reason": "tool_calls" if tool else "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
        include_usage = bool((data.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(body).encode() + b"\n\n"

        async def events() -> AsyncGenerator[bytes, None]:
            delay = float(control.get("chunk_delay", 0))
            yield chunk({"role": "assistant", "content": ""})
            if control.get("endless"):
                while True:
                    await asyncio.sleep(delay or 0.05)
                    yield chunk({"content": "."})
            if call is not None:
                if plan is not None and text:
                    yield chunk({"content": text})
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                **call,
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "function": {"arguments": call["function"]["arguments"]},
                            }
                        ]
                    }
                )
                yield chunk({}, "tool_calls")
            else:
                for piece in _pieces(text, int(control.get("chunks", 3))):
                    if delay:
                        await asyncio.sleep(delay)
                    yield chunk({"content": piece})
                yield chunk({}, "stop")
            if include_usage:
                body = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                yield b"data: " + json.dumps(body).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(counted(events(), request), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        await record(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": "standin"}
                    for m in ("standin-1", "standin-2")
                ],
            }
        )

    async def messages(request: Request) -> Response:
        """Anthropic Messages API."""
        body, data = await record(request)
        problem = _anthropic_auth(request) or _anthropic_invalid(data, count_only=False)
        if problem:
            return problem
        control = _control(data)
        await asyncio.sleep(float(control.get("delay", 0)))
        if control.get("status"):
            status = int(control["status"])
            kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
            return _anthropic_error(status, kind, "standin error", control.get("retry_after"))
        answer = _messages_answer(state, data, control)
        prompt = state.anthropic_cache.bill(data["model"], _anthropic_blocks(data))
        written = prompt.cache_write_5m + prompt.cache_write_1h
        out_tokens = _tokens(answer)
        usage = {
            "input_tokens": prompt.input,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": prompt.cache_read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": prompt.cache_write_5m,
                "ephemeral_1h_input_tokens": prompt.cache_write_1h,
            },
            "output_tokens": out_tokens,
            "service_tier": "standard",
        }
        state.billed.append(usage)
        state.charge("/v1/messages", data["model"], prompt, out_tokens, provider="anthropic")
        mid = "msg_" + uuid.uuid4().hex[:24]
        headers = {"request-id": "req_" + uuid.uuid4().hex[:24]}
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": data.get("model"),
            "content": answer,
            "stop_reason": "tool_use" if answer[-1]["type"] == "tool_use" else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not data.get("stream"):
            return JSONResponse(message, headers=headers)
        events = _messages_events(message, control)
        return StreamingResponse(
            counted(events, request), media_type="text/event-stream", headers=headers
        )

    async def count_tokens(request: Request) -> Response:
        """Anthropic's token counter: the prompt's tokens, as a request would bill them."""
        _, data = await record(request)
        problem = _anthropic_auth(request) or _anthropic_invalid(data, count_only=True)
        if problem:
            return problem
        prefixes = block_prefixes(_anthropic_blocks(data))
        return JSONResponse({"input_tokens": prefixes[-1][1] if prefixes else 0})

    async def responses(request: Request) -> Response:
        """OpenAI Responses API."""
        _, data = await record(request)
        if not (request.headers.get("authorization") or request.headers.get("api-key")):
            return _openai_error(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "invalid_request_error",
            )
        conversation = _responses_conversation(state, data)
        if isinstance(conversation, Response):
            return conversation
        control = _control(data)
        await asyncio.sleep(float(control.get("delay", 0)))
        if control.get("status"):
            return _error(int(control["status"]), "standin error", control.get("retry_after"))
        output = _responses_answer(state, data, conversation, control)
        rid = "resp_" + uuid.uuid4().hex[:24]
        if data.get("store", True) is not False:
            state.responses[rid] = StoredResponse(conversation, output)
            if len(state.responses) > _KEEP_RESPONSES:  # a long benchmark run stays bounded
                del state.responses[next(iter(state.responses))]
        prompt = _responses_prompt(state, data, conversation)
        reasoning = sum(_tokens(item["summary"]) for item in output if item["type"] == "reasoning")
        out_tokens = _tokens(output)
        usage = {
            "input_tokens": prompt.total,
            # the openai SDK's ResponseUsage requires cache_write_tokens; automatic caching
            # bills no writes
            "input_tokens_details": {"cached_tokens": prompt.cache_read, "cache_write_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt.total + out_tokens,
        }
        state.billed.append(usage)
        state.charge("/v1/responses", data["model"], prompt, out_tokens, provider="openai")
        response = _response_object(rid, data, output, usage)
        headers = {"x-request-id": "req_" + uuid.uuid4().hex[:24]}
        if not data.get("stream"):
            return JSONResponse(response, headers=headers)
        events = _responses_events(response, control)
        return StreamingResponse(
            counted(events, request), media_type="text/event-stream", headers=headers
        )

    async def received(request: Request) -> Response:
        return JSONResponse(
            [
                {
                    "method": r.method,
                    "path": r.path,
                    "query": r.query,
                    "headers": r.headers,
                    "body": r.body.decode(errors="replace"),
                }
                for r in state.received
            ]
        )

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    async def bill(request: Request) -> Response:
        return JSONResponse(state.bill())

    async def clock(request: Request) -> Response:
        """GET: the simulated time; POST `{"advance": seconds}`: move it on first."""
        if request.method == "POST":
            try:
                seconds = float((await request.json())["advance"])
                state.clock.advance(seconds)
            except (ValueError, KeyError, TypeError):
                return _error(400, 'expected {"advance": <seconds, not negative>}')
        return JSONResponse({"now": state.clock.now()})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/_standin/received", received, methods=["GET"]),
            Route("/_standin/reset", reset, methods=["POST"]),
            Route("/_standin/bill", bill, methods=["GET"]),
            Route("/_standin/clock", clock, methods=["GET", "POST"]),
        ]
    )


def _tool_call() -> dict[str, Any]:
    return {
        "id": "call_web_fetch_1",
        "type": "function",
        "function": {"name": "web_fetch", "arguments": '{"url": "https://example.com"}'},
    }


# --- shared by Messages and Responses ---------------------------------------------------------


def _control(data: dict[str, Any]) -> dict[str, Any]:
    control = data.get("x_standin")
    return control if isinstance(control, dict) else {}


def _pieces(text: str, n: int) -> list[str]:
    """`text` cut into at most `n` (at least 1) nearly equal pieces; none for ""."""
    if not text:
        return []
    step = -(-len(text) // max(1, n))
    return [text[i : i + step] for i in range(0, len(text), step)]


def _tokens(value: Any) -> int:
    """A rough token count of what the stand-in answers: a quarter of its JSON, at least 1."""
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


_KEEP_RESPONSES = 1000


def _plan(
    state: StandIn, wire: str, data: dict[str, Any], conversation: list[Any], control: Any
) -> PlannedTurn | None:
    """The planner's turn, unless the request's `x_standin` chooses the answer itself."""
    if state.planner is None or (isinstance(control, dict) and "tool_calls" in control):
        return None
    return state.planner(wire, data, conversation)


def _wants_tool(state: StandIn, control: dict[str, Any], offered: bool, answered: bool) -> bool:
    forced = control.get("tool_calls")
    if isinstance(forced, bool):
        return forced
    if state.call_tools and offered and state.script:
        return True
    return state.call_tools and offered and not answered


def _choose_call(state: StandIn, tools: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The scripted call: `script_tool`, else the first preferred tool offered, else the
    request's first tool; its input from `tool_inputs` or made from the tool's schema."""
    if state.script:
        name, arguments = state.script.pop(0)
        return name, dict(arguments)
    if state.script_tool is not None:
        name, arguments = state.script_tool
        return name, dict(arguments)
    if not tools:
        return "web_fetch", {"url": "https://example.com/"}
    name = next((n for n in state.tool_preference if n in tools), next(iter(tools)))
    if name in state.tool_inputs:
        return name, dict(state.tool_inputs[name])
    return name, _sample_input(tools[name])


_SAMPLE_STRINGS = {
    "url": "https://example.com/",
    "uri": "https://example.com/",
    "file_path": "README.md",
    "filepath": "README.md",
    "path": "README.md",
    "command": "echo standin",
    "cmd": "echo standin",
}


def _sample_input(schema: Any) -> dict[str, Any]:
    """Input satisfying `schema`'s required properties, harmless for an agent to run.

    >>> _sample_input({"properties": {"command": {"type": "array"}}, "required": ["command"]})
    {'command': ['echo', 'standin']}
    """
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    return {name: _sample_value(name, properties.get(name)) for name in required}


def _sample_value(name: str, schema: Any) -> Any:
    if not isinstance(schema, dict):
        schema = {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        return ["echo", "standin"] if name.lower() in ("command", "cmd", "argv") else []
    if kind == "object":
        return _sample_input(schema)
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return False
    return _SAMPLE_STRINGS.get(name.lower(), "standin")


def _result_chars(content: Any) -> int:
    """Characters of a tool result: a string, or the text of a list of blocks/parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(b.get("text") or "") for b in content if isinstance(b, dict))
    return 0


def _done_text(name: str, content: Any) -> str:
    return f"standin: done after tool {name}; result had {_result_chars(content)} chars"


def _event(name: str, body: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(body)}\n\n".encode()


# --- Anthropic Messages --------------------------------------------------------------------


def _anthropic_auth(request: Request) -> Response | None:
    if request.headers.get("x-api-key") or request.headers.get("authorization"):
        return None
    return _anthropic_error(401, "authentication_error", "x-api-key header is required")


def _anthropic_invalid(data: Any, *, count_only: bool) -> Response | None:
    """The real API's request checks, as far as a test can trip them."""

    def bad(message: str) -> Response:
        return _anthropic_error(400, "invalid_request_error", message)

    if not isinstance(data, dict):
        return bad("body: Input should be a valid dictionary")
    if not isinstance(data.get("messages"), list):
        return bad("messages: Field required")
    if not isinstance(data.get("model"), str):
        return bad("model: Field required")
    max_tokens = data.get("max_tokens")
    if not count_only and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        return bad("max_tokens: Field required")
    if "tools" in data and not isinstance(data["tools"], list):
        return bad("tools: Input should be a valid list")
    messages: list[Any] = data["messages"]
    for i, m in enumerate(messages):
        # A "system" message inside `messages` is part of the API the anthropic SDK (2.x)
        # describes (SystemMessageParam: text only), and Claude Code sends one; the API of
        # 2024 refused it with 'Unexpected role "system"'. Accepted, so Claude Code works.
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            role = m.get("role") if isinstance(m, dict) else None
            return bad(f'messages.{i}: Unexpected role "{role}"')
        content = m.get("content")
        if not isinstance(content, (str, list)):
            return bad(f"messages.{i}.content: Field required")
        if m["role"] == "system" and isinstance(content, list):
            if any(not isinstance(b, dict) or b.get("type") != "text" for b in content):
                return bad(f"messages.{i}.content: a system message holds text blocks only")
    marked = sum(marker_ttl(block) is not None for _, block in _anthropic_blocks(data))
    if marked > ANTHROPIC_MAX_BREAKPOINTS:
        return bad(
            f"A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be "
            f"provided. Found {marked}."
        )
    return _anthropic_unpaired(messages)


def _blocks(message: Any, kind: str) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


def _anthropic_unpaired(messages: list[Any]) -> Response | None:
    """The API refuses a tool_use whose tool_result is not in the next message, and a
    tool_result that answers no tool_use of the previous message: a proxy that reorders or
    drops blocks must hear about it here too. (A "system" message in between is skipped.)"""
    turns = [(i, m) for i, m in enumerate(messages) if m.get("role") != "system"]
    for n, (i, m) in enumerate(turns):
        uses = {b.get("id") for b in _blocks(m, "tool_use")} if m["role"] == "assistant" else set()
        after = turns[n + 1][1] if n + 1 < len(turns) else None
        answered = {b.get("tool_use_id") for b in _blocks(after, "tool_result")}
        if uses and after is not None and uses - answered:
            missing = ", ".join(sorted(str(u) for u in uses - answered))
            return _anthropic_error(
                400,
                "invalid_request_error",
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {missing}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message.",
            )
        before = turns[n - 1][1] if n > 0 else None
        issued = {b.get("id") for b in _blocks(before, "tool_use")}
        content = m["content"] if isinstance(m["content"], list) else []
        for k, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                if block.get("tool_use_id") not in issued:
                    return _anthropic_error(
                        400,
                        "invalid_request_error",
                        f"messages.{i}.content.{k}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous "
                        "message.",
                    )
    return None


def _messages_answer(
    state: StandIn, data: dict[str, Any], control: dict[str, Any]
) -> list[dict[str, Any]]:
    """The content blocks of the answer: [thinking], then text, or text and a tool_use."""
    messages: list[dict[str, Any]] = data["messages"]
    tools = {
        t["name"]: t.get("input_schema")
        for t in data.get("tools") or []
        # server tools ("web_search_20250305", …) run at Anthropic: only client tools are called
        if isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and t.get("type", "custom") == "custom"
    }
    results: list[dict[str, Any]] = []
    for m in reversed(messages):
        if m["role"] == "assistant":
            break
        results[:0] = _blocks(m, "tool_result")
    blocks: list[dict[str, Any]] = []
    thinking = data.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        said = "" if thinking.get("display") == "omitted" else "The stand-in considers the turn."
        signature = base64.b64encode(hashlib.sha256(json.dumps(messages).encode()).digest())
        blocks.append({"type": "thinking", "thinking": said, "signature": signature.decode()})
    plan = _plan(state, "messages", data, messages, control)
    if plan is not None:
        if plan.text or plan.call is None:
            blocks.append({"type": "text", "text": plan.text})
        if plan.call is not None:
            name, arguments = plan.call
            tool_id = "toolu_" + uuid.uuid4().hex[:24]
            blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": arguments})
        return blocks
    if _wants_tool(state, control, bool(tools), bool(results)):
        name, arguments = _choose_call(state, tools)
        if state.server_tool:
            blocks += _server_search()
        blocks.append({"type": "text", "text": f"standin: calling {name}"})
        tool_id = "toolu_" + uuid.uuid4().hex[:24]
        blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": arguments})
        return blocks
    if results:
        names = {b.get("id"): b.get("name") for m in messages for b in _blocks(m, "tool_use")}
        last = results[-1]
        text = _done_text(str(names.get(last.get("tool_use_id"), "?")), last.get("content"))
    else:
        text = f"standin: received {len(messages)} messages"
    blocks.append({"type": "text", "text": state.replies.get(str(data.get("model")), text)})
    return blocks


def _server_search() -> list[dict[str, Any]]:
    """A web search Anthropic ran server-side, as its answer carries it."""
    search_id = "srvtoolu_" + uuid.uuid4().hex[:24]
    found = {
        "type": "web_search_result",
        "url": "https://example.com/standin",
        "title": "Stand-in result",
        "encrypted_content": "EqgfCioIARgBIiQ" + uuid.uuid4().hex,
        "page_age": None,
    }
    return [
        {
            "type": "server_tool_use",
            "id": search_id,
            "name": "web_search",
            "input": {"query": "standin"},
        },
        {"type": "web_search_tool_result", "tool_use_id": search_id, "content": [found]},
    ]


def _anthropic_blocks(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """A Messages prompt as blocks in the API's order, tools → system → messages."""
    blocks: list[tuple[str, Any]] = [("tool", t) for t in data.get("tools") or []]
    system = data.get("system")
    if isinstance(system, list):
        blocks += [("system", b) for b in system]
    elif system:
        blocks.append(("system", system))
    for m in data["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            blocks += [(m["role"], b) for b in content]
        else:
            blocks.append((m["role"], content))
    return blocks


async def _messages_events(
    message: dict[str, Any], control: dict[str, Any]
) -> AsyncGenerator[bytes, None]:
    """`message` as Anthropic streams it: message_start, ping, each block's start, deltas and
    stop, message_delta (stop_reason, output_tokens), message_stop."""
    delay = float(control.get("chunk_delay", 0))
    chunks = int(control.get("chunks", 3))
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})

    def delta(index: int, body: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
        )

    for index, block in enumerate(message["content"]):
        kind = block["type"]
        opened = {
            "tool_use": {**block, "input": {}},
            "server_tool_use": {**block, "input": {}},
            "web_search_tool_result": block,  # streamed whole, as the API does
            "text": {"type": "text", "text": ""},
        }.get(kind, {"type": "thinking", "thinking": "", "signature": ""})
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opened},
        )
        if kind == "text" and control.get("endless"):
            while True:
                await asyncio.sleep(delay or 0.05)
                yield delta(index, {"type": "text_delta", "text": "."})
        if kind == "thinking":
            for piece in _pieces(block["thinking"], chunks):
                yield delta(index, {"type": "thinking_delta", "thinking": piece})
            yield delta(index, {"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            for piece in _pieces(block["text"], chunks):
                if delay:
                    await asyncio.sleep(delay)
                yield delta(index, {"type": "text_delta", "text": piece})
        elif kind == "web_search_tool_result":
            pass
        else:
            yield delta(index, {"type": "input_json_delta", "partial_json": ""})
            for piece in _pieces(json.dumps(block["input"]), chunks):
                yield delta(index, {"type": "input_json_delta", "partial_json": piece})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


# --- OpenAI Responses ----------------------------------------------------------------------


_MODEL_ITEMS = (
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "reasoning",
    "web_search_call",
)
_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
_RESULT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _responses_conversation(state: StandIn, data: Any) -> list[Any] | Response:
    """The whole input the request stands for: a stored conversation it continues
    (`previous_response_id`: that response's input and output) and its own `input`."""

    def bad(message: str, param: str | None, code: str | None = None) -> Response:
        return _openai_error(400, message, "invalid_request_error", param, code)

    if not isinstance(data, dict):
        return bad("We could not parse the JSON body of your request.", None)
    if not isinstance(data.get("model"), str):
        return bad("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    given = data.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    elif given is None:
        given = []
    if not isinstance(given, list) or any(not isinstance(item, dict) for item in given):
        return bad("Invalid type for 'input': expected a string or an array of items.", "input")
    if "tools" in data and not isinstance(data["tools"], list):
        return bad("Invalid type for 'tools': expected an array.", "tools")
    earlier: list[Any] = []
    previous = data.get("previous_response_id")
    if previous is not None:
        stored = state.responses.get(str(previous))
        if stored is None:
            return bad(
                f"Previous response with id '{previous}' not found.",
                "previous_response_id",
                "previous_response_not_found",
            )
        earlier = stored.input + stored.output
    conversation = earlier + given
    called = {item.get("call_id") for item in conversation if item.get("type") in _CALL_ITEMS}
    for item in conversation:
        if item.get("type") in _RESULT_ITEMS and item.get("call_id") not in called:
            return bad(
                f"No tool call found for function call output with call_id {item.get('call_id')}.",
                "input",
            )
    return conversation


def _responses_answer(
    state: StandIn, data: dict[str, Any], conversation: list[Any], control: dict[str, Any]
) -> list[dict[str, Any]]:
    """The output items: [reasoning], then a function_call or a message."""
    tools = {
        t["name"]: t.get("parameters")
        for t in data.get("tools") or []
        # Codex also offers "custom", "local_shell", "web_search" tools: only functions are called
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
    }
    results: list[dict[str, Any]] = []
    for item in reversed(conversation):
        if item.get("type") in _MODEL_ITEMS or item.get("role") == "assistant":
            break
        if item.get("type") in _RESULT_ITEMS:
            results.insert(0, item)
    output: list[dict[str, Any]] = []
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") != "none":
        said = "The stand-in considers the turn."
        summary = [{"type": "summary_text", "text": said}] if reasoning.get("summary") else []
        thought = {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex[:24], "summary": summary}
        if "reasoning.encrypted_content" in (data.get("include") or []):
            thought["encrypted_content"] = "gAAAAB" + base64.b64encode(said.encode()).decode()
        output.append(thought)
    plan = _plan(state, "responses", data, conversation, control)
    if plan is not None and plan.call is not None:
        name, arguments = plan.call
    elif plan is None and _wants_tool(state, control, bool(tools), bool(results)):
        name, arguments = _choose_call(state, tools)
    else:
        name = ""
    if name:
        output.append(
            {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex[:24],
                "call_id": "call_" + uuid.uuid4().hex[:24],
                "name": name,
                "arguments": json.dumps(arguments),
                "status": "completed",
            }
        )
        return output
    if plan is not None:
        text = plan.text
    elif results:
        names = {
            i.get("call_id"): i.get("name") for i in conversation if i.get("type") in _MODEL_ITEMS
        }
        last = results[-1]
        text = _done_text(str(names.get(last.get("call_id"), "?")), last.get("output"))
    else:
        text = f"standin: received {len(conversation)} input items"
    text = state.replies.get(str(data.get("model")), text)
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    output.append(
        {
            "type": "message",
            "id": "msg_" + uuid.uuid4().hex[:24],
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
    )
    return output


def _responses_prompt(state: StandIn, data: dict[str, Any], conversation: list[Any]) -> PromptUsage:
    """The input as OpenAI's automatic caching bills it: instructions, tools and every input
    item (earlier turns included) in that order."""
    parts: list[tuple[str, Any]] = []
    if data.get("instructions"):
        parts.append(("instructions", data["instructions"]))
    parts += [("tool", t) for t in data.get("tools") or []]
    parts += [("input", item) for item in conversation]
    return _openai_prompt(state, data, parts)


def _openai_prompt(
    state: StandIn, data: dict[str, Any], parts: list[tuple[str, Any]]
) -> PromptUsage:
    key, retention = data.get("prompt_cache_key"), data.get("prompt_cache_retention")
    return state.openai_cache.bill(
        parts,
        key=key if isinstance(key, str) else None,
        retention=retention if isinstance(retention, str) else None,
    )


def billed_as_reported(usage: dict[str, Any], route: str) -> dict[str, int]:
    """What the stand-in billed (`StandIn.billed`, each format's own fields) in the report's
    terms: `input` is the uncached input; the cache reads and writes apart (`cacheWrite` all
    writes, `cacheWrite1h` the 1-hour ones among them)."""
    if route.endswith("/messages"):
        return {
            "input": usage["input_tokens"],
            "cacheRead": usage["cache_read_input_tokens"],
            "cacheWrite": usage["cache_creation_input_tokens"],
            "output": usage["output_tokens"],
            "cacheWrite1h": usage["cache_creation"]["ephemeral_1h_input_tokens"],
        }
    if route.endswith("/responses"):
        cached = usage["input_tokens_details"]["cached_tokens"]
        total, output = usage["input_tokens"], usage["output_tokens"]
    else:
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        total, output = usage["prompt_tokens"], usage["completion_tokens"]
    return {
        "input": total - cached,
        "cacheRead": cached,
        "cacheWrite": 0,
        "output": output,
        "cacheWrite1h": 0,
    }


def _response_object(
    rid: str, data: dict[str, Any], output: list[Any], usage: dict[str, Any]
) -> dict[str, Any]:
    """The `response` object, with the fields the openai SDK's `Response` model reads."""
    now = int(time.time())
    reasoning = data.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": "completed",
        "background": False,
        "completed_at": now,
        "error": None,
        "incomplete_details": None,
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "max_tool_calls": data.get("max_tool_calls"),
        "metadata": data.get("metadata") or {},
        "model": data["model"],
        "output": output,
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "prompt_cache_key": data.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "service_tier": "default",
        "store": data.get("store", True),
        "temperature": data.get("temperature", 1.0),
        "text": data.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p", 1.0),
        "truncation": data.get("truncation", "disabled"),
        "usage": usage,
        "user": None,
    }


async def _responses_events(
    response: dict[str, Any], control: dict[str, Any]
) -> AsyncGenerator[bytes, None]:
    """`response` as the Responses API streams it, `sequence_number` on every event:
    created, in_progress, each item's added … done events, completed (listing every item)."""
    delay = float(control.get("chunk_delay", 0))
    chunks = int(control.get("chunks", 3))
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return _event(kind, {"type": kind, "sequence_number": next(numbers), **fields})

    pending = {
        **response,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "completed_at": None,
    }
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        at: dict[str, Any] = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            yield event("response.output_item.added", output_index=index, item=opened)
            part = item["content"][0]
            empty = {**part, "text": ""}
            yield event("response.content_part.added", **at, content_index=0, part=empty)
            if control.get("endless"):
                while True:
                    await asyncio.sleep(delay or 0.05)
                    yield event(
                        "response.output_text.delta", **at, content_index=0, delta=".", logprobs=[]
                    )
            for piece in _pieces(part["text"], chunks):
                if delay:
                    await asyncio.sleep(delay)
                yield event(
                    "response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[]
                )
            yield event(
                "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
            )
            yield event("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "function_call":
            opened = {**item, "arguments": "", "status": "in_progress"}
            yield event("response.output_item.added", output_index=index, item=opened)
            for piece in _pieces(item["arguments"], chunks):
                yield event("response.function_call_arguments.delta", **at, delta=piece)
            yield event(
                "response.function_call_arguments.done",
                **at,
                name=item["name"],
                arguments=item["arguments"],
            )
        else:
            opened = {**item, "summary": []}
            opened.pop("encrypted_content", None)
            yield event("response.output_item.added", output_index=index, item=opened)
            for n, summary in enumerate(item["summary"]):
                empty = {**summary, "text": ""}
                yield event(
                    "response.reasoning_summary_part.added", **at, summary_index=n, part=empty
                )
                for piece in _pieces(summary["text"], chunks):
                    yield event(
                        "response.reasoning_summary_text.delta", **at, summary_index=n, delta=piece
                    )
                yield event(
                    "response.reasoning_summary_text.done",
                    **at,
                    summary_index=n,
                    text=summary["text"],
                )
                yield event(
                    "response.reasoning_summary_part.done", **at, summary_index=n, part=summary
                )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


# --- serving -------------------------------------------------------------------------------


@contextmanager
def serve_app(app: Any) -> Iterator[int]:
    """Serve an ASGI app with uvicorn on an ephemeral 127.0.0.1 port in a thread; yield it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def run_standin(*, record: bool = True) -> Iterator[StandIn]:
    """Serve a stand-in on an ephemeral 127.0.0.1 port in a background thread."""
    state = StandIn(record=record)
    with serve_app(create_standin(state)) as port:
        state.port = port
        yield state


def main() -> None:
    parser = argparse.ArgumentParser(description="stand-in OpenAI upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="keep received requests")
    args = parser.parse_args()
    state = StandIn(record=args.record)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    state.port = sock.getsockname()[1]
    print(f"STANDIN_PORT={state.port}", flush=True)
    config = uvicorn.Config(create_standin(state), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
