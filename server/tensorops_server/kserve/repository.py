"""The model repository: the operations, always there, and the quantized inner-product
sessions each caller loads as models of its own (RepositoryModelLoad, RepositoryModelUnload,
RepositoryIndex). A session model belongs to its caller; its session lives in the server's
session store, which may expire or evict it: the repository then says so."""

from __future__ import annotations

import json
from typing import Any

import grpc

from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import codec, table

from .. import errors
from ..execution import CallState
from ..service import Service
from .conversion import choice_name, converted_attributes, empty_message, npy_tensor, parameter_value
from .models import VERSION, Model, operation_model, session_model

_CONFIG = "config"
_FILE = "file:"


# The largest `config` of RepositoryModelLoad: a JSON object of a few scalars.
MAX_CONFIG_CHARS = 4096


def _config_arguments(value) -> dict[str, Any]:
    """The constructor's scalar arguments from the JSON object `config`."""
    if not isinstance(value, str):
        raise errors.invalid(_CONFIG, f"expected a string_param holding a JSON object, got {choice_name(value)}")
    errors.check_length(_CONFIG, value, MAX_CONFIG_CHARS)
    try:
        config = json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise errors.invalid(
            _CONFIG, "expected a JSON object of scalars, got text that is not JSON or is nested too deep"
        ) from None
    if not isinstance(config, dict):
        raise errors.invalid(_CONFIG, f"expected a JSON object, got {type(config).__name__}")
    for name, item in config.items():
        if isinstance(item, (dict, list)):
            errors.check_length(f"{_CONFIG}.name", name)
            raise errors.invalid(
                name,
                f"expected a number, a string or a bool, got a JSON {'object' if isinstance(item, dict) else 'array'}",
            )
    return config


def load_request(request, call: CallState) -> codec.Decoded:
    """A RepositoryModelLoadRequest as the CreateQuantizedInnerProduct request."""
    op = table.CREATE_SESSION
    arguments: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    tensor_names = [f.name for f in op.inputs]
    for key, p in request.parameters.items():
        errors.check_length("parameters.name", key)
        value = parameter_value(key, p)
        if key == _CONFIG:
            arguments.update(_config_arguments(value))
        elif key.startswith(_FILE):
            name = key[len(_FILE) :].removesuffix(".npy")
            if name not in tensor_names:
                raise errors.invalid(key, f"expected the files {', '.join(_FILE + n for n in tensor_names)}")
            if not isinstance(value, bytes):
                raise errors.invalid(key, f"expected a bytes_param, got {choice_name(value)}")
            tensors[name] = npy_tensor(key, value, call)
        else:
            raise errors.invalid(key, f"unknown parameter `{key}`: expected `config` and `file:<tensor>`")
    return codec.Decoded(
        empty_message(op.request_class), tensors, attributes=converted_attributes(request.model_name, op, arguments)
    )


class Repository:
    """Every model by name: the operations, and each caller's session models."""

    def __init__(self, service: Service):
        self.service = service
        self.models = {name: operation_model(entry) for name, entry in service.table.items()}
        self.sessions: dict[tuple[str, str], Model] = {}  # (owner, model name) -> session model

    def model(self, name: str, version: str, identity: str) -> Model:
        errors.check_length("model_name", name)
        if version not in ("", VERSION):
            errors.check_length("model_version", version)
            raise errors.not_found(
                f"model {name} has no version {version!r} (its only version is {VERSION})", field="model_version"
            )
        model = self.models.get(name) or self.sessions.get((identity, name))
        if model is None:
            raise errors.not_found(
                f"no model named {name!r}: the models are the operations "
                f"({', '.join(self.models)}) and the sessions loaded with RepositoryModelLoad",
                field="model_name",
            )
        return model

    def visible(self, identity: str) -> list[Model]:
        """The models a caller sees: the operations and its own sessions."""
        return list(self.models.values()) + [m for (owner, _), m in self.sessions.items() if owner == identity]

    def ready(self, model: Model, identity: str) -> bool:
        return model.entry is not None or any(s.id == model.session_id for s in self.service.store.snapshot(identity))

    async def forward(self, model: Model, decoded: codec.Decoded, call: CallState):
        """The forward of a session model; NOT_FOUND, and the model forgotten, when its
        session is gone."""
        try:
            return await self.service.forward(model.session_id, decoded, call)
        except errors.Failure as failure:
            if failure.code is grpc.StatusCode.NOT_FOUND:
                self.sessions.pop((call.identity, model.name), None)
                raise errors.not_found(
                    f"model {model.name}: its session expired, was evicted or released, or "
                    "the server restarted; load it again",
                    field="model_name",
                ) from None
            raise

    def index(self, identity: str, ready_only: bool) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for name in self.models:
            response.models.add(name=name, version=VERSION, state="READY")
        live = {s.id for s in self.service.store.snapshot(identity)}
        for (owner, name), model in list(self.sessions.items()):
            if owner != identity:
                continue
            if model.session_id in live:
                response.models.add(name=name, version=VERSION, state="READY")
            elif not ready_only:
                response.models.add(
                    name=name,
                    version=VERSION,
                    state="UNAVAILABLE",
                    reason="the session expired, was evicted or released",
                )
        return response

    async def load(self, request, call: CallState) -> None:
        name = request.model_name
        if not name:
            raise errors.invalid("model_name", "required: the name the session will be called by")
        errors.check_length("model_name", name)  # kept while the session lives, listed by RepositoryIndex
        if name in self.models:
            raise errors.invalid("model_name", f"{name!r} is an operation; choose another name for the session")
        session = await self.service.open_session(load_request(request, call), call)
        live = {s.id for s in self.service.store.snapshot(call.identity)}
        for key in [k for k, m in self.sessions.items() if k[0] == call.identity and m.session_id not in live]:
            del self.sessions[key]  # sessions gone meanwhile
        previous = self.sessions.get((call.identity, name))
        self.sessions[(call.identity, name)] = session_model(name, session.id, *session.shape)
        if previous is not None and previous.session_id in live:  # a reload replaces the session
            self.service.store.release(previous.session_id, call.identity)

    def unload(self, name: str, identity: str) -> None:
        errors.check_length("model_name", name)
        if name in self.models:
            raise errors.invalid("model_name", f"{name!r} is an operation: only sessions are loaded and unloaded")
        model = self.sessions.pop((identity, name), None)
        if model is None:
            raise errors.not_found(f"no session model named {name!r}", field="model_name")
        try:
            self.service.store.release(model.session_id, identity)
        except errors.Failure:
            pass  # it expired or was evicted meanwhile: unloaded all the same
