"""What `amc` exits with, so a script can tell how a command (or a watched task) ended.

- 0: done; for `amc task watch TASK_ID` and `amc demo`: the task (every task) succeeded;
- 1: the watched task failed (`amc task watch`), or a demo goal did not succeed;
- 2: the command was used wrongly or named something that is not there: a bad option or
  value, an unknown or ambiguous task id, a missing certificate, a setting that keeps a
  server from starting, a port that is taken;
- 3: the watched task was cancelled;
- 4: the cloud could not be reached, refused the operator's certificate, or did not answer
  (`amc task watch` rides out a cloud that went away after it reached it, for 5 minutes); at
  `amc host run`, what answered at its address is not an amc cloud, or the cloud refused the
  host while it ran (its certificate or host id revoked, or no host identity in it);
- 5: a certificate of ours would be refused before any call is made: the operator's (or the
  host's, `amc host run`) has expired, is not valid yet or was not signed by the fleet CA in
  the PKI folder, or that CA certificate has expired (the TLS handshake would fail with
  nothing but "Socket closed"), or its key file holds another key; or the cloud's
  certificate was refused in the handshake (another fleet's, or expired);
- 70: an unexpected internal error (`--debug` prints its traceback);
- 130: interrupted (Ctrl-C);
- 141: whatever read the output stopped reading (`amc task watch ID | head -1`): 128 + SIGPIPE,
  as a shell reports it, and never 1, which would say the watched task failed.

`docs/cli.md` repeats this list as a table; `tests/console/test_cli_scripts.py` holds the
commands to it.
"""

from __future__ import annotations

from typing import Final

OK: Final = 0
TASK_FAILED: Final = 1
USAGE: Final = 2
TASK_CANCELLED: Final = 3
CLOUD: Final = 4
CERTIFICATE: Final = 5
INTERNAL: Final = 70
INTERRUPTED: Final = 130
BROKEN_PIPE: Final = 141
