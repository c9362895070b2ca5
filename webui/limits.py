"""How much of a request body either console reads: the largest a real request needs, and no
more, so one client cannot make a console hold gigabytes.

Without a limit a JSON body was read whole into memory before anything looked at it (FastAPI
reads a route's body before its dependencies run, so before the bearer or session check): one
anonymous 400 MiB POST to /api/tasks left the gateway holding ~0.9 GB. The largest real body is
a task submission with every secret the cloud takes at its longest, JSON-escaped (`\\uXXXX`,
12 bytes a character at worst): under 0.8 MiB. A longer one is refused with 413 before it is
read (by its Content-Length) or as soon as it goes past the limit (a chunked upload).
"""

from __future__ import annotations

from typing import Final

#: Bytes of a request body a console reads at most (FastAPI's `max_body_size`).
MAX_BODY_BYTES: Final = 1024 * 1024
