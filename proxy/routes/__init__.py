"""The routes beside the proxied ones: the report (`report`), `/v1/memories` (`memories`), the
upstream's model list (`models`), `/metrics` (`metrics`), `/healthz` (`health`) and WebSocket
handshakes (`websocket`). `proxy/app.py` `route_table` mounts them."""
