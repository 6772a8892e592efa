"""Wire adapters: one module per API format, behind the Protocols in `proxy.wire.types`."""

from proxy.wire.chat import ChatCompletions, ChatCompletionsRequest
from proxy.wire.messages import AnthropicMessages, MessagesRequest
from proxy.wire.responses import CallNames, OpenAIResponses, ResponsesRequest
from proxy.wire.types import Reply, ReplyWatcher, WireFormat, WireRequest

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
]
