"""Every way an `amc` command can fail, as one line with a hint, and the exit code it means.

Commands raise what they hit (a gRPC status, a missing certificate file, a setting the cloud
refuses, a usage error from click) or a `UserError` of their own; `run_main` turns each into
`amc <command>: <what happened> (<what to do>)` on stderr with the code from
`console.exit_codes`. Only `--debug` (or AMC_DEBUG=1) adds the traceback, and only an
unexpected error gets the "run with --debug" note.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass

import grpc
import typer
from pydantic import ValidationError

# Typer ships its own copy of click (typer._click); its usage errors are of these classes.
from typer._click import exceptions as click_errors

from cloud.cert_validity import verify_failed
from console import exit_codes
from console.cli_output import OutputClosed
from planner.errors import CLOUD_DATABASE, WAITING_FOR_KEY
from telemetry.redaction import scrub


class UserError(Exception):
    """Something the person can fix: `message` says what is wrong, `hint` what to do."""

    def __init__(self, message: str, hint: str = "", code: int = exit_codes.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code

    def line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


@dataclass(frozen=True, slots=True)
class CloudTarget:
    """Where the failed call went and as whom: it makes a gRPC failure actionable."""

    address: str
    operator: str
    #: The CA certificate the cloud's own certificate is checked against ("" unknown).
    ca: str = ""
    #: Whose certificate `operator` names: an "operator"'s or a "viewer"'s (`--viewer`).
    kind: str = "operator"


def from_rpc(error: grpc.aio.AioRpcError, target: CloudTarget) -> UserError:
    """A gRPC failure as the person at the terminal can act on it."""
    code: grpc.StatusCode = error.code()
    details = (error.details() or "").strip()
    waiting = dict(error.trailing_metadata() or ()).get(WAITING_FOR_KEY)
    if code is grpc.StatusCode.UNAVAILABLE and waiting == CLOUD_DATABASE:
        return UserError(
            f"the cloud at {target.address} answered, but it is waiting for {waiting}",
            "try again once the database is back; the cloud's health check says NOT_SERVING "
            "until then",
            exit_codes.CLOUD,
        )
    refused = verify_failed(details)
    if code is grpc.StatusCode.UNAVAILABLE and refused:
        # The cloud is up; its certificate is another fleet's, expired or not valid yet.
        return UserError(
            f"the cloud at {target.address} presented a certificate that "
            f"{target.ca or 'the fleet CA'} does not vouch for: {refused}",
            "point --pki-dir at the folder of that cloud's fleet; if it is the right one, the "
            "cloud's server.pem needs renewing: `amc certs init DIR` issues a new one",
            exit_codes.CERTIFICATE,
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        why = "did not answer in time" if code is grpc.StatusCode.DEADLINE_EXCEEDED else "is down"
        reason = details.splitlines()[0] if details else why
        return UserError(
            f"cannot reach the cloud at {target.address}: {reason}",
            "is it running? `amc up` starts one on this machine; point at another with "
            "--cloud HOST:PORT or AMC_CLOUD",
            exit_codes.CLOUD,
        )
    if code is grpc.StatusCode.PERMISSION_DENIED and target.kind == "viewer":
        return UserError(
            f"the cloud at {target.address} refused viewer {target.operator!r}: {details}",
            "a viewer certificate may only read; to change anything, use an operator "
            "certificate (--operator NAME)",
            exit_codes.CLOUD,
        )
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return UserError(
            f"the cloud at {target.address} refused {target.kind} {target.operator!r}: {details}",
            f"use {'a viewer' if target.kind == 'viewer' else 'an operator'} certificate of this "
            f"fleet: --{target.kind} NAME and --pki-dir DIR",
            exit_codes.CLOUD,
        )
    if code is grpc.StatusCode.NOT_FOUND:
        listing = (
            "flows with `amc flows list`"
            if details.startswith("flow ")
            else ("tasks with `amc task list`")
        )
        return UserError(details or "not found", f"list {listing}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return UserError(f"the cloud refused the request: {details}")
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        return UserError(details or code.name.lower())
    return UserError(
        f"the cloud answered {code.name}: {details}",
        "try again; run with --debug for the full error",
        exit_codes.CLOUD,
    )


def not_utf8(exc: UnicodeEncodeError) -> UserError:
    """Text that is not UTF-8 (a Latin-1 file read into an argument or a variable): Python
    keeps its bytes as lone surrogates, which cannot be sent. Text from the command line is
    shown with those bytes as `\\xNN`, as the terminal gave them (around the first, when it is
    long); any other (a setting, a password) is not shown at all: it may be a secret."""
    if not any(exc.object in arg for arg in sys.argv[1:]):
        return UserError(
            "a setting or file holds text that is not UTF-8 (not shown: it may be a secret)",
            "convert it to UTF-8, e.g. with `iconv -t UTF-8`",
        )
    start, end = max(0, exc.start - 30), exc.start + 50
    text = exc.object[start:end]
    try:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that did not come from a byte
        shown = text.encode("utf-8", "backslashreplace").decode()
    before, after = "…" * (start > 0), "…" * (end < len(exc.object))
    return UserError(
        f"'{before}{shown}{after}' is not UTF-8 text",
        "amc sends text as UTF-8: convert it first, e.g. with `iconv -t UTF-8`",
    )


def explain(exc: BaseException) -> UserError | None:
    """The one line for a failure a person can fix, or None for a bug."""
    from cloud.cert_validity import CertificateInvalid
    from cloud.settings import SettingError, validation_problem
    from host.cloud_channel import AnotherHostsCertificate, CertificateMissing
    from host.lease_client import HostRefused, NotACloud
    from planner.errors import PlannerConfigError

    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, UnicodeEncodeError) and exc.reason == "surrogates not allowed":
        return not_utf8(exc)
    if isinstance(exc, click_errors.UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "amc"
        # Typer checks values with pydantic, whose message starts "Value error, ".
        message = exc.format_message().replace("Value error, ", "")
        return UserError(message, f"see `{command} --help`")
    if isinstance(exc, SettingError | PlannerConfigError):
        return UserError(str(exc))
    if isinstance(exc, CertificateMissing):  # a file that is not there, unless it says more
        said = str(exc)
        return UserError(said, "" if "(" in said else "make one with `amc certs host DIR HOST_ID`")
    if isinstance(exc, CertificateInvalid):  # the host's own, at `amc host run`
        return UserError(
            str(exc),
            "issue a new one with `amc certs host DIR HOST_ID` from the fleet's CA",
            exit_codes.CERTIFICATE,
        )
    if isinstance(exc, ValidationError):
        return UserError(*validation_problem(exc))
    if isinstance(exc, NotACloud):  # at `amc host run`: another server answers at the address
        return UserError(str(exc), code=exit_codes.CLOUD)
    if isinstance(exc, AnotherHostsCertificate):  # at `amc host run`: its files name another
        return UserError(str(exc), code=exit_codes.CLOUD)
    if isinstance(exc, HostRefused):  # at `amc host run`: the cloud refused its certificate
        return UserError(
            str(exc),
            "the host stopped: install a new certificate (`amc certs host DIR HOST_ID`), or "
            "have the revocation lifted (`amc certs unrevoke`), and start it again",
            exit_codes.CLOUD,
        )
    return None


#: Command groups (a second word names the command) and global options taking a value.
_VALUED = frozenset({"--cloud", "--pki-dir", "--operator", "--viewer"})


def _prefix(argv: list[str], groups: Collection[str]) -> str:
    """`amc task list` for the message prefix: the command's words, options skipped (a word
    of `groups`, the app's command groups, is followed by its command)."""
    words = ["amc"]
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = word in _VALUED
            continue
        words.append(word)
        if len(words) == 3 or words[1] not in groups:
            break
    return " ".join(words)


def run_main(
    main: Callable[[], int | None],
    argv: list[str],
    *,
    debug: Callable[[], bool],
    groups: Collection[str],
) -> int:
    """Run the command line and turn what it raised into one line and an exit code."""
    try:
        return main() or exit_codes.OK
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except typer.Abort:
        return exit_codes.INTERRUPTED
    except typer.Exit as done:
        return int(done.exit_code)
    except (OutputClosed, BrokenPipeError):
        # The reader went away: nothing more can be said on stdout, and Python's own flush at
        # exit must not fail again; the exit code says what happened, the task's state does not.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.BROKEN_PIPE
    except Exception as exc:
        # Scrubbed (`telemetry.redaction`) as log lines are: the text is a library's, and may
        # quote a password or key the command was configured with.
        if debug():
            print(scrub(traceback.format_exc()), end="", file=sys.stderr)
        problem = explain(exc)
        prefix = _prefix(argv, groups)
        if isinstance(exc, click_errors.NoSuchOption) and exc.ctx is not None:
            # Click knows which command refused it: an unknown option taking a value made that
            # value read as the command (`amc --certs pki task list`: "amc pki: …").
            prefix = exc.ctx.command_path
        if problem is None:
            note = "" if debug() else " (run with --debug for the traceback)"
            print(
                scrub(f"{prefix}: unexpected {type(exc).__name__}: {exc}{note}"),
                file=sys.stderr,
            )
            return exit_codes.INTERNAL
        print(scrub(f"{prefix}: {problem.line()}"), file=sys.stderr)
        return problem.code
