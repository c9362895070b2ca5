"""Where a cloud listens, and where every client (CLI, console, host) looks for it, by default.

Its own module so that the `amc` command line names it without importing `cloud.settings`
(pydantic-settings and the cloud's whole settings class: ~90 ms of every `amc task …`).
"""

from __future__ import annotations

DEFAULT_CLOUD_ADDRESS = "127.0.0.1:50051"
