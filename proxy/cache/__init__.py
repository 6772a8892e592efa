"""The provider's prompt cache as the proxy sees it: each request's cached prefix, the session
it belongs to, and what ctxbudget's own changes did to it (`sessions`)."""
