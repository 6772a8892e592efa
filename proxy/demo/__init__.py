"""`ctxbudget demo`: the proxy in front of a built-in upstream that answers without a model
(`upstream`), a bundled sample OpenClaw session replayed through it, the report (`run`)."""
