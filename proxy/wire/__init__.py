"""Wire adapters: one module per API format, behind the Protocols in `proxy.wire.types`."""

from proxy.wire.chat import ChatCompletions, ChatCompletionsRequest
from proxy.wire.types import Reply, WireFormat, WireRequest

__all__ = [
    "ChatCompletions",
    "ChatCompletionsRequest",
    "Reply",
    "WireFormat",
    "WireRequest",
]
