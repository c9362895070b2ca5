"""What arrives on the wire: request bytes parsed without surprises, text fields checked once.

Every request passes here before any servicer sees it (`cloud.boundary` puts `parser(...)` in
place of each method's deserializer), so no servicer meets bytes that do not parse or text a
database cannot store:

- bytes that are not a valid message become a `Malformed` (the boundary answers
  INVALID_ARGUMENT): "goal: not valid UTF-8" when a text field holds invalid UTF-8 (found by
  parsing the same bytes as a twin of the message whose text fields are bytes), else "request:
  not a valid amc.v1.SubmitTaskRequest message";
- a NUL character in any text field, at any depth, becomes a `Malformed` naming the field
  ("devices[2].serial: NUL characters are not allowed"): PostgreSQL cannot store NUL in text,
  and no amc identifier, goal or name needs one;
- except in the fields listed in `SANITISED` — text a host only reports: about work it already
  did (a result's summary and replay report, a progress summary) or about itself (a phone's
  model and why it is kept out of work, its agent version) — where NULs and bytes that are not
  UTF-8 are replaced by U+FFFD instead: refusing those would refuse a finished result forever
  or a hello (no Welcome, every phone idle), a host cutting a summary by bytes may cut a
  character in two, and one in C++ or Go may pass a phone's `getprop` output on as it read it;
- fields the message does not declare (a newer client's, or bytes added on purpose) are
  dropped: proto3 parsers keep them, and the cloud stores some messages as serialized protos
  (a decision's action and observation), so they were written into the decision log past
  every size limit (a screenshot among them) and handed back to every operator reading it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message

from planner.decision import kept

#: Text fields whose NULs and invalid UTF-8 are replaced (by `REPLACEMENT`), never refused: what
#: a host only reports (the LeaseService contract: never a reason to refuse its message). A
#: replay report's flow id mended so names no flow the attempt was handed: the report is left
#: out and the result recorded, as for any flow id it was not handed (`validate.replay`).
SANITISED: Final = frozenset(
    {
        "amc.v1.TaskResult.summary",
        "amc.v1.Progress.summary",
        "amc.v1.FlowReplayReport.flow_id",
        "amc.v1.FlowReplayReport.reason",
        "amc.v1.Device.model",
        "amc.v1.Device.reason",
        "amc.v1.HostHello.agent_version",
    }
)
REPLACEMENT: Final = "\ufffd"


@dataclass(frozen=True, slots=True)
class Malformed:
    """A request that cannot be used, and why (naming the field when one is to blame)."""

    problem: str
    #: What could still be read of the request (the task id an in-stream answer names): the
    #: message itself when only its text was refused, its bytes twin (`bytes_twin`, text as
    #: bytes) when it did not parse but its twin did; None when nothing could be read.
    partial: Message | None = dataclasses.field(default=None, compare=False)
    #: Only a NUL in its text was wrong: `partial` is the request itself, parsed whole. A
    #: servicer that refuses records alone (ShipDecisions) takes it and checks each record's
    #: text itself (`check_text`); every other one refuses the request.
    text_only: bool = dataclasses.field(default=False, compare=False)


def parser(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A deserializer that never raises: the message, checked, or a `Malformed`.

    `deserialize` is what gRPC was given (`SomeRequest.FromString` for every generated
    servicer); for any other callable, a failure is reported without a field name.
    """
    descriptor: Descriptor | None = getattr(
        getattr(deserialize, "__self__", None), "DESCRIPTOR", None
    )

    def parse(raw: bytes) -> Any:
        try:
            message = deserialize(raw)
        except Exception:
            fixed = repaired(descriptor, raw)
            if isinstance(fixed, Malformed):
                return fixed
            try:
                message = deserialize(fixed)
            except Exception:
                return Malformed(_not_valid(descriptor))
            raw = fixed
        if isinstance(message, Message):
            message.DiscardUnknownFields()  # ~1 µs for a renewal
        # No zero byte in the encoding, no NUL in any text field (UTF-8 encodes U+0000, and only
        # it, as 0x00): most requests (a renewal, as a rule) skip the walk over their fields.
        if isinstance(message, Message) and b"\x00" in raw:
            problem = check_text(message)
            if problem is not None:
                return Malformed(problem, message, text_only=True)
        return message

    return parse


def check_text(message: Message) -> str | None:
    """The first text field holding a NUL (as "path: problem"), sanitising `SANITISED` fields
    in place; None when every text field is fine."""
    for path, owner, field, index in text_fields(message, ""):
        value: str = (
            getattr(owner, field.name)[index] if index is not None else getattr(owner, field.name)
        )
        if "\x00" not in value:
            continue
        if field.full_name in SANITISED:
            clean = value.replace("\x00", REPLACEMENT)
            if index is None:
                setattr(owner, field.name, clean)
            else:
                getattr(owner, field.name)[index] = clean
            continue
        return f"{path}: NUL characters are not allowed"
    return None


def text_fields(
    message: Message, prefix: str
) -> Iterator[tuple[str, Message, FieldDescriptor, int | None]]:
    """(path, owning message, field, index in a repeated field) of every set text field, at
    any depth; paths start with `prefix`."""
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_STRING:
            if repeated:
                for i in range(len(value)):
                    yield f"{path}[{i}]", message, field, i
            else:
                yield path, message, field, None
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field):
            if repeated:
                for i, item in enumerate(value):
                    yield from text_fields(item, f"{path}[{i}].")
            else:
                yield from text_fields(value, f"{path}.")


def keep_texts(
    message: Message,
    prefix: str,
    limit: int,
    redact: Callable[[str], str] | None = None,
    limits: Mapping[str, int] | None = None,
) -> None:
    """Every text field of `message` masked by `redact` and cut to `limit` bytes as the
    decision log keeps a text (`planner.decision.kept`, its marker naming the field by its
    path). For an action's texts (what to type, a reason, an id, its purpose): the model's
    writing, at any length, listed with every decision; the host cuts them before shipping and
    the cloud cuts what a host that did not sent (one of 5 MB made a task's log unreadable,
    and refusing it lost the step and its cost). `limits`: other limits by path."""
    for path, owner, field, index in text_fields(message, prefix):
        texts = getattr(owner, field.name)
        text = texts if index is None else texts[index]
        most = limits.get(path, limit) if limits else limit
        text = kept(redact(text) if redact else text, most, f"this {path}")
        if index is None:
            setattr(owner, field.name, text)
        else:
            texts[index] = text


def _is_map(field: FieldDescriptor) -> bool:
    """amc's contracts have no map fields; one from elsewhere is not walked."""
    return field.message_type is not None and bool(field.message_type.GetOptions().map_entry)


def _not_valid(descriptor: Descriptor | None) -> str:
    name = f" {descriptor.full_name}" if descriptor is not None else ""
    return f"request: not a valid{name} message"


def repaired(descriptor: Descriptor | None, raw: bytes) -> bytes | Malformed:
    """Bytes that did not parse: the same request with the invalid UTF-8 of its `SANITISED`
    fields replaced (U+FFFD), when that is all that was wrong; else why they cannot be used."""
    whole = _not_valid(descriptor)
    if descriptor is None:
        return Malformed(whole)
    try:
        twin = bytes_twin(descriptor).FromString(raw)
    except Exception:
        return Malformed(whole)
    replaced: list[str] = []
    path = _replace_invalid_utf8(twin, "", descriptor.file.pool, replaced)
    if path:
        return Malformed(f"{path}: not valid UTF-8", twin)
    if not replaced:
        return Malformed(whole, twin)
    fixed: bytes = twin.SerializeToString()
    return fixed


def _replace_invalid_utf8(
    message: Message, prefix: str, original: descriptor_pool.DescriptorPool, replaced: list[str]
) -> str | None:
    """The first field of a bytes twin that is text in the `original` pool and is not UTF-8,
    replacing the bad bytes of `SANITISED` fields on the way (their paths go to `replaced`)."""
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        items = list(enumerate(value)) if field.is_repeated else [(None, value)]
        for i, item in items:
            where = path if i is None else f"{path}[{i}]"
            if field.type == FieldDescriptor.TYPE_BYTES and _is_text(original, field.full_name):
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    if field.full_name not in SANITISED:
                        return where
                    clean = item.decode("utf-8", "replace").encode("utf-8")
                    replaced.append(where)
                    if i is None:
                        setattr(message, field.name, clean)
                    else:
                        value[i] = clean
            elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field):
                found = _replace_invalid_utf8(item, f"{where}.", original, replaced)
                if found:
                    return found
    return None


def _is_text(pool: descriptor_pool.DescriptorPool, full_name: str) -> bool:
    return bool(pool.FindFieldByName(full_name).type == FieldDescriptor.TYPE_STRING)


@functools.cache
def bytes_twin(descriptor: Descriptor) -> Any:
    """The message class of `descriptor` with every text field (its own and its nested
    messages', across files) declared as bytes, so invalid UTF-8 parses and can be located."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        for fields in _all_fields(proto.message_type):
            for field in fields:
                if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
        pool.Add(proto)
        added.add(file.name)

    add(descriptor.file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(descriptor.full_name))


def _all_fields(messages: Any) -> Iterator[Any]:
    """The fields of every message declared in `messages`, nested ones included (not map
    entries: a map's key cannot be bytes, and maps are not walked anyway)."""
    for message in messages:
        if message.options.map_entry:
            continue
        yield message.field
        yield from _all_fields(message.nested_type)
