"""The routes beside the proxied ones: the report (`report`) and `/v1/memories` (`memories`)."""
