"""The exceptions ctxbudget raises, and how each reaches a client.

    CtxBudgetError
    ├── ConfigError            broken config file, bad value, unknown key (never reaches a client
    │                          as a 500: the last good config stays in force)
    ├── RequestError           the client's request is wrong: 400 / 401 / 403 / 404 / 408 / 413
    │   ├── BadRequest         400: malformed JSON, schema errors
    │   ├── Unauthorized       401: proxy key missing or wrong
    │   ├── Forbidden          403: admin endpoint without the admin key
    │   ├── NotFound           404: no such route, request record or memory
    │   ├── MethodNotAllowed   405: a route asked with a method it does not serve
    │   ├── RequestTimeout     408: headers or body sent too slowly (proxy.limits)
    │   └── PayloadTooLarge    413: body over proxy.maxBodyBytes
    ├── UpstreamError          the provider failed: its own status (429, 5xx), 502, 504
    ├── ClampError             500: a clamp raised and contextBudget.failClosed is true
    ├── InternalError          500: a bug of ctxbudget's (logged with its traceback)
    └── ServiceUnavailable     503: the database (database.url) did not answer; plain
        │                      forwarding does not need it and goes on
        └── TooManyConnections 503: a peer over proxy.limits.maxConnectionsPerClient

Every error reaches a client from one handler (`proxy/app.py`), in the shape of the client's
wire format (`WireFormat.error_body`): OpenAI's
`{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`, or on the Anthropic
Messages routes Anthropic's `{"type": "error", "error": {"type": ..., "message": ...}}`.
"""

from __future__ import annotations

from typing import Any


class CtxBudgetError(Exception):
    """Base class; `status`, `type` and `code` shape the client-facing error."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers: dict[str, str] = {}
        """Extra response headers (e.g. `retry-after`, `www-authenticate`)."""

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class ConfigError(CtxBudgetError):
    """The config file or environment holds a value ctxbudget cannot use."""

    type = "config_error"
    code = "invalid_config"


class RequestError(CtxBudgetError):
    """The client's request cannot be served as sent."""

    status = 400
    type = "invalid_request_error"


class BadRequest(RequestError):
    status = 400
    code = "invalid_request"


class Unauthorized(RequestError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(RequestError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(RequestError):
    status = 404
    code = "not_found"


class MethodNotAllowed(RequestError):
    status = 405
    code = "method_not_allowed"


class RequestTimeout(RequestError):
    """The client sent its request too slowly (`proxy.limits`): answered by the connection
    itself, which then closes (`proxy/access/connections.py`)."""

    status = 408
    code = "request_timeout"


class PayloadTooLarge(RequestError):
    status = 413
    code = "request_too_large"


class UpstreamError(CtxBudgetError):
    """The upstream provider failed or could not be reached."""

    type = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str | None = "upstream_error",
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        # An upstream that already answered in OpenAI shape is passed on as it said it.
        if self.body is not None and isinstance(self.body.get("error"), dict):
            return self.body
        return super().to_dict()


class ClampError(CtxBudgetError):
    """A clamp raised while contextBudget.failClosed is true."""

    status = 500
    type = "server_error"
    code = "clamp_failed"


class InternalError(CtxBudgetError):
    """An exception ctxbudget did not expect: a bug. The client gets its class name only."""

    status = 500
    type = "server_error"
    code = "internal_error"


class ServiceUnavailable(CtxBudgetError):
    status = 503
    type = "server_error"
    code = "database_unavailable"


class TooManyConnections(ServiceUnavailable):
    """A peer already holds `proxy.limits.maxConnectionsPerClient` connections."""

    code = "too_many_connections"
