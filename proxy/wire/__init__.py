"""Wire adapters: one module per API format, behind the Protocols in `proxy.wire.types`."""

from proxy.wire.chat import ChatCompletions, ChatCompletionsRequest
from proxy.wire.messages import AnthropicMessages, MessagesRequest
from proxy.wire.responses import CallNames, OpenAIResponses, ResponsesRequest
from proxy.wire.types import Reply, ReplyWatcher, WireFormat, WireRequest


def for_path(path: str) -> WireFormat:
    """The wire format a path's errors take before an endpoint has parsed anything (a 404, a
    request sent too slowly): Anthropic's under `/v1/messages`, OpenAI's elsewhere."""
    return _MESSAGES if path.startswith(("/v1/messages", "/messages")) else _CHAT


_CHAT = ChatCompletions()
_MESSAGES = AnthropicMessages()

__all__ = [
    "AnthropicMessages",
    "CallNames",
    "ChatCompletions",
    "ChatCompletionsRequest",
    "MessagesRequest",
    "OpenAIResponses",
    "Reply",
    "ReplyWatcher",
    "ResponsesRequest",
    "WireFormat",
    "WireRequest",
    "for_path",
]
