"""`GET /healthz`: liveness, with no credential and no store touched.

`ctxbudget serve` asks it of a port it cannot bind, to say whether ctxbudget already holds
it (`service`); load balancers and the tests ask it to know the server is up.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "service": "ctxbudget"})
