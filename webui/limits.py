"""How much of a request body either console reads: the largest a real request needs, and no
more, so one client cannot make a console hold gigabytes.

Without a limit a JSON body was read whole into memory before anything looked at it (FastAPI
reads a route's body before its dependencies run, so before the bearer or session check): one
anonymous 400 MiB POST to /api/tasks left the gateway holding ~0.9 GB. The largest real body is
a task submission with every secret the cloud takes at its longest, JSON-escaped (`\\uXXXX`,
12 bytes a character at worst): under 0.8 MiB. A longer one is refused with 413 before it is
read (by its Content-Length) or as soon as it goes past the limit (a chunked upload).

The refusal is an HTTPException raised where the body is read, so the console's error
handlers answer it like any other error (the API's JSON, else the error page). FastAPI's own
`max_body_size` could not be used: Starlette's limiter, outside every handler, replaced the
answer to a too-long Content-Length with its plain-text "Content Too Large".
"""

from __future__ import annotations

from typing import Final

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Bytes of a request body a console reads at most.
MAX_BODY_BYTES: Final = 1024 * 1024
#: What a client sending more is told (with 413).
TOO_LARGE: Final = f"the request body is larger than the {MAX_BODY_BYTES >> 20} MiB a console reads"


def _too_large() -> HTTPException:
    return HTTPException(413, TOO_LARGE)


class _BodyLimit:
    """Stops reading a request's body past `MAX_BODY_BYTES`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        too_long = declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES
        read = 0

        async def limited() -> Message:
            nonlocal read
            if too_long:
                raise _too_large()
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > MAX_BODY_BYTES:
                    raise _too_large()
            return message

        await self.app(scope, limited, send)


def install_body_limit(app: FastAPI) -> None:
    """Refuse request bodies past `MAX_BODY_BYTES` on `app` (413, answered by its handlers)."""
    app.add_middleware(_BodyLimit)
