"""gRPC server reflection as operators' tools ask for it: grpc.reflection.v1 and
v1alpha, every symbol grpcurl describes (a service, a method, a message, a field).

grpcio-reflection (1.85) serves v1alpha only, and looks symbols up with the descriptor
pool's FindFileContainingSymbol, which in protobuf's upb implementation does not know
methods: `grpcurl describe kestrel.v1.Gateway.Infer` answered "Symbol not found" while
`describe kestrel.v1.Gateway` worked. Here a symbol the pool does not find is looked up
as a member of its parent (a service's method), and v1 is served by the same servicer:
its messages are v1alpha's, field for field, under another package, so the v1alpha
classes decode and encode them. v1's file descriptor is v1alpha's renamed and added to
the pool, so the v1 service describes itself too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """v1's file descriptor: v1alpha's under package grpc.reflection.v1 (idempotent)."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for f in message.field:
            if f.type_name.startswith(old):
                f.type_name = new + f.type_name[len(old):]
    for service in proto.service:
        for m in service.method:
            m.input_type = new + m.input_type[len(old):]
            m.output_type = new + m.output_type[len(old):]
    pool.Add(proto)


class Reflection(ReflectionServicer):  # type: ignore[misc]
    """grpcio-reflection's servicer, finding methods too."""

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        found = super()._file_containing_symbol(request, fully_qualified_name)
        if not found.HasField("error_response") or "." not in fully_qualified_name:
            return found
        parent, member = fully_qualified_name.rsplit(".", 1)
        try:
            service = self._pool.FindServiceByName(parent)
        except KeyError:
            return found
        if member not in service.methods_by_name:
            return found
        return super()._file_containing_symbol(request, parent)


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) of `service_names` and of itself on `server`."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    servicer = Reflection([*service_names, V1_SERVICE, V1ALPHA_SERVICE], pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
        for name in (V1_SERVICE, V1ALPHA_SERVICE)])
