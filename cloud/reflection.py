"""Server reflection, v1 and v1alpha, serving the contracts *with their comments*.

The proto comments are the documentation an integrator writes a host from. Generated `_pb2`
modules drop them, and grpcio-reflection serializes descriptors from its pool (again without
them), so `grpcurl describe` would show bare declarations. This servicer answers from the
FileDescriptorSet `scripts/gen_protos.py` writes with source info
(`gen/amc/v1/descriptor_set.binpb`) instead, and serves the same answers under both
`grpc.reflection.v1.ServerReflection` (what current grpcurl and Postman ask first) and
`grpc.reflection.v1alpha.ServerReflection` (what older clients know). The two protocols have
identical messages, so the v1 service is the v1alpha implementation behind a v1 method path.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

DESCRIPTOR_SET = "descriptor_set.binpb"
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1ALPHA_SERVICE = reflection.SERVICE_NAME


def _contract_files() -> list[descriptor_pb2.FileDescriptorProto]:
    """The amc.v1 files and their imports, with source info, in dependency order."""
    data = resources.files("amc.v1").joinpath(DESCRIPTOR_SET).read_bytes()
    return list(descriptor_pb2.FileDescriptorSet.FromString(data).file)


def _file(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(serialized)


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """reflection v1's descriptor: v1alpha's, renamed (the messages are the same)."""
    v1 = _file(reflection_pb2.DESCRIPTOR.serialized_pb)
    v1.name = V1_FILE
    v1.package = V1_PACKAGE
    v1.ClearField("options")
    return v1


def served_files() -> list[descriptor_pb2.FileDescriptorProto]:
    """Every file reflection can describe, dependencies first."""
    reflection_v1alpha = _file(reflection_pb2.DESCRIPTOR.serialized_pb)
    return [
        *_contract_files(),
        _file(health_pb2.DESCRIPTOR.serialized_pb),
        reflection_v1alpha,
        _v1_reflection_file(),
    ]


class CommentedReflection(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """grpcio-reflection's servicer, answering file requests from descriptors with comments."""

    def __init__(
        self, service_names: Iterable[str], files: list[descriptor_pb2.FileDescriptorProto]
    ) -> None:
        pool = descriptor_pool.DescriptorPool()
        for f in files:
            pool.Add(f)
        super().__init__(list(service_names), pool=pool)
        self._files = {f.name: f for f in files}

    def _response(self, request: Any, filename: str) -> reflection_pb2.ServerReflectionResponse:
        """The file and everything it imports, as serialized FileDescriptorProtos."""
        names: list[str] = []
        pending = [filename]
        while pending:
            name = pending.pop()
            if name not in names:
                names.append(name)
                pending.extend(self._files[name].dependency)
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=[self._files[n].SerializeToString() for n in names]
            ),
            original_request=request,
        )

    def _not_found(self, request: Any) -> reflection_pb2.ServerReflectionResponse:
        return reflection_pb2.ServerReflectionResponse(
            error_response=reflection_pb2.ErrorResponse(
                error_code=grpc.StatusCode.NOT_FOUND.value[0],
                error_message=b"not found",
            ),
            original_request=request,
        )

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        if filename not in self._files:
            return self._not_found(request)
        return self._response(request, filename)

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        """Also for a method, field or enum value: the pool finds top-level symbols, so a
        nested name is looked up through its parent."""
        symbol = fully_qualified_name
        while symbol:
            try:
                name = self._pool.FindFileContainingSymbol(symbol).name
            except KeyError:
                symbol = symbol.rpartition(".")[0]
                continue
            return self._response(request, name)
        return self._not_found(request)

    def _file_containing_extension(
        self, request: Any, containing_type: str, extension_number: int
    ) -> Any:
        try:
            message = self._pool.FindMessageTypeByName(containing_type)
            extension = self._pool.FindExtensionByNumber(message, extension_number)
            name = self._pool.FindFileContainingSymbol(extension.full_name).name
        except KeyError:
            return self._not_found(request)
        return self._response(request, name)


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on `server` for these services (and itself)."""
    names = [*service_names, V1_SERVICE, V1ALPHA_SERVICE]
    servicer = CommentedReflection(names, served_files())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handlers = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    # Registered the way generated `add_*_to_server` functions register a service.
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE, handlers),))
    server.add_registered_method_handlers(V1_SERVICE, handlers)
