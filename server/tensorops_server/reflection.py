"""gRPC server reflection under both of its service names, from a descriptor pool of its own.

grpcio-reflection implements `grpc.reflection.v1alpha.ServerReflection` only, while current
tools (grpcurl, Postman, grpc-js and Go clients) ask `grpc.reflection.v1.ServerReflection`
first. The two protocols are wire-identical: v1 is v1alpha's reflection.proto under another
package, with the same messages, fields and numbers. So the one v1alpha servicer answers
under both names, describing v1 with a copy of the v1alpha file renamed to the v1 package.

The same renaming describes services served under another package than their .proto's
(`aliases`): the KServe endpoint's messages are declared in `tensorops.kserve.v2` and
served as `inference.GRPCInferenceService` (see proto/tensorops/kserve/v2/inference.proto).

The servicer reads a pool of its own, holding the files of the services listed (with their
dependencies) and those renamed copies: the process's default pool is left alone, so a
renamed copy never clashes with the original (tritonclient's `inference` package, say).
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from .pipeline import add_handlers

V1ALPHA_SERVICE = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE, V1ALPHA_SERVICE)


def renamed(file, name: str, package: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of `file` under another file name and package (its own type
    references follow; the file must not depend on other files of its package)."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    old, new = f".{proto.package}.", f".{package}."
    proto.name, proto.package = name, package
    proto.ClearField("options")  # language package names of the original

    def rename(type_name: str) -> str:
        return new + type_name[len(old) :] if type_name.startswith(old) else type_name

    def messages(types):
        for message in types:
            yield message
            yield from messages(message.nested_type)

    for message in messages(proto.message_type):
        for f in message.field:
            if f.HasField("type_name"):  # messages and enums
                f.type_name = rename(f.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type, method.output_type = rename(method.input_type), rename(method.output_type)
    return proto


def reflection_pool(service_names: Iterable[str], aliases: Iterable[descriptor_pb2.FileDescriptorProto] = ()):
    """A pool with the files of `service_names` (from the default pool, with their
    dependencies), the reflection services (v1 renamed from v1alpha) and `aliases`."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
        added.add(file.name)

    default = descriptor_pool.Default()
    for name in service_names:
        add(default.FindFileContainingSymbol(name))
    add(reflection_pb2.DESCRIPTOR)
    for proto in (
        renamed(reflection_pb2.DESCRIPTOR, "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"),
        *aliases,
    ):
        pool.Add(proto)
    return pool


def enable(
    service_names: Iterable[str], server: grpc.aio.Server, aliases: Iterable[descriptor_pb2.FileDescriptorProto] = ()
) -> None:
    """Serve reflection (v1 and v1alpha) describing `service_names`, the services of the
    renamed files `aliases` and both reflection services."""
    service_names, aliases = tuple(service_names), tuple(aliases)
    names = service_names + tuple(f"{a.package}.{s.name}" for a in aliases for s in a.service) + SERVICE_NAMES
    servicer = ReflectionServicer(names, pool=reflection_pool(service_names, aliases))
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for name in SERVICE_NAMES:
        add_handlers(server, name, {"ServerReflectionInfo": handler})
