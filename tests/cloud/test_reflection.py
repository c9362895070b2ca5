"""Reflection v1 and v1alpha on a real cloud: the contracts are served with their comments, so
`grpcurl describe` (which asks v1 first) shows the documentation an integrator writes from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from cloud.server import CloudServer
from tests.cloud.cloud_harness import channel

PATHS = {
    "v1": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "v1alpha": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}


async def _ask(
    ch: grpc.aio.Channel, version: str, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    """One request on the reflection stream of `version` (the two share their messages)."""
    method: Any = ch.stream_stream(
        PATHS[version],
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    call = method()
    await call.write(request)
    response: reflection_pb2.ServerReflectionResponse = await call.read()
    await call.done_writing()
    return response


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_both_versions_describe_the_contracts_with_their_comments(
    cloud: CloudServer, pki_dir: Path, version: str
) -> None:
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        listed = await _ask(ch, version, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {
            "amc.v1.PlannerService",
            "amc.v1.LeaseService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names
        found = await _ask(
            ch,
            version,
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="amc.v1.ScreenObservation"
            ),
        )
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in found.file_descriptor_response.file_descriptor_proto
        ]
        # The file and what it imports, so a client can build every type it names.
        assert files[0].name == "amc/v1/types.proto"
        assert {"google/protobuf/duration.proto", "google/protobuf/timestamp.proto"} <= {
            f.name for f in files
        }
        types = files[0]
        index = [m.name for m in types.message_type].index("ScreenObservation")
        comments = {
            tuple(loc.path): " ".join(loc.leading_comments.split())
            for loc in types.source_code_info.location
        }
        assert comments[(4, index)].startswith("What the host sees on the phone's screen")
        field = [f.name for f in types.message_type[index].field].index("screen_width")
        assert "1 to 16,384" in comments[(4, index, 2, field)]

        missing = await _ask(
            ch,
            version,
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="amc.v1.Nope"),
        )
        assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        itself = await _ask(
            ch,
            version,
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            ),
        )
        (described,) = itself.file_descriptor_response.file_descriptor_proto
        assert descriptor_pb2.FileDescriptorProto.FromString(described).package == (
            "grpc.reflection.v1"
        )
