"""gRPC server reflection under both of its service names.

grpcio-reflection implements `grpc.reflection.v1alpha.ServerReflection` only, while current
tools (grpcurl, Postman, grpc-js and Go clients) ask `grpc.reflection.v1.ServerReflection`
first. The two protocols are wire-identical: v1 is v1alpha's reflection.proto under another
package, with the same messages, fields and numbers. So the one v1alpha servicer answers
under both names, and a copy of the v1alpha file descriptor renamed to the v1 package is
added to the descriptor pool, so that reflection can describe the v1 service as well.
"""
from __future__ import annotations

from typing import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from .service import add_handlers

V1ALPHA_SERVICE = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE, V1ALPHA_SERVICE)

_V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1_PACKAGE = "grpc.reflection.v1"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """reflection.proto of grpc.reflection.v1: v1alpha's, its package renamed."""
    try:
        pool.FindFileByName(_V1_FILE)
        return  # a grpcio-reflection with v1 (or an earlier call) put it there
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    proto.name, proto.package = _V1_FILE, _V1_PACKAGE
    proto.ClearField("options")  # the Java/C# package names of v1alpha
    for message in proto.message_type:
        for f in message.field:
            if f.type_name.startswith(old):
                f.type_name = f".{_V1_PACKAGE}." + f.type_name[len(old):]
    for service in proto.service:
        for method in service.method:
            method.input_type = f".{_V1_PACKAGE}." + method.input_type[len(old):]
            method.output_type = f".{_V1_PACKAGE}." + method.output_type[len(old):]
    pool.AddSerializedFile(proto.SerializeToString())


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) listing `service_names` and both reflection services."""
    _add_v1_descriptor(descriptor_pool.Default())
    names = tuple(service_names) + SERVICE_NAMES
    servicer = ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    for name in SERVICE_NAMES:
        add_handlers(server, name, {"ServerReflectionInfo": handler})
