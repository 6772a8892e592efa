"""The request path of proxied requests: stages, the offload process for large bodies, the
relay, the chat command, recall and the response headers."""
