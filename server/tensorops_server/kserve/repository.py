"""The model repository: the operations, always there, and the quantized inner-product
sessions each caller loads as models of its own (RepositoryModelLoad, RepositoryModelUnload,
RepositoryIndex). A session model belongs to its caller; its session lives in the server's
session store, which may expire or evict it: the repository then says so."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import grpc

from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import codec, table

from .. import errors
from ..execution import CallState
from ..service import Service
from ..statedir import Connections, transaction
from .conversion import choice_name, converted_attributes, empty_message, npy_tensor, parameter_value
from .models import VERSION, Model, Statistics, operation_model, session_model, statistics

_CONFIG = "config"
_FILE = "file:"


# A worker adds its models' statistics to the server's at most this often (and before it
# answers ModelStatistics): what another worker counted shows within this time.
STATISTICS_INTERVAL = 0.5

_COUNTS = ("success_count", "success_ns", "fail_count", "fail_ns")
_ADD_STATISTICS = (
    "insert into model_statistics values (?, ?, ?, ?, ?, ?, ?) on conflict (owner, name) do update set "
    + ", ".join(f"{c} = {c} + excluded.{c}" for c in _COUNTS)
    + ", last_inference_ms = max(last_inference_ms, excluded.last_inference_ms)"
)
# The statistics of a caller's session models that are no longer loaded.
_FORGET_STATISTICS = (
    "delete from model_statistics where owner = ? and name not in (select name from models where owner = ?)"
)

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
    """Every model by name: the operations, and each caller's session models. The session
    models are kept in the server's shared state (statedir.py), beside their sessions: a
    model loaded through one worker process is listed, used and unloaded through any."""

    def __init__(self, service: Service):
        self.service = service
        self.models = {name: operation_model(entry) for name, entry in service.table.items()}
        self._db = Connections(service.store.state)
        # inferences counted here and not yet added to the server's: (owner, model) -> counts;
        # the owner is "" for the operations, which every caller shares
        self._counted: dict[tuple[str, str], Statistics] = {}
        self._counted_since = time.monotonic()
        self._counting = threading.Lock()

    def model(self, name: str, version: str, identity: str) -> Model:
        errors.check_length("model_name", name)
        if version not in ("", VERSION):
            errors.check_length("model_version", version)
            raise errors.not_found(
                f"model {name} has no version {version!r} (its only version is {VERSION})", field="model_version"
            )
        model = self.models.get(name) or self._session_model(identity, name)
        if model is None:
            raise errors.not_found(
                f"no model named {name!r}: the models are the operations "
                f"({', '.join(self.models)}) and the sessions loaded with RepositoryModelLoad",
                field="model_name",
            )
        return model

    def _session_model(self, identity: str, name: str) -> Model | None:
        row = (
            self._db.get()
            .execute("select session_id, n, k from models where owner = ? and name = ?", (identity, name))
            .fetchone()
        )
        return None if row is None else session_model(name, *row)

    def _session_models(self, identity: str) -> list[tuple[Model, bool]]:
        """The caller's session models, each with whether its session still lives."""
        rows = self._db.get().execute(
            "select m.name, m.session_id, m.n, m.k, s.id is not null from models m "
            "left join sessions s on s.id = m.session_id and s.owner = m.owner where m.owner = ? order by m.name",
            (identity,),
        )
        return [(session_model(name, sid, n, k), bool(live)) for name, sid, n, k, live in rows]

    def visible(self, identity: str) -> list[Model]:
        """The models a caller sees: the operations and its own sessions."""
        return list(self.models.values()) + [model for model, _ in self._session_models(identity)]

    def ready(self, model: Model, identity: str) -> bool:
        return model.entry is not None or self.service.store.alive(model.session_id, identity)

    async def forward(self, model: Model, decoded: codec.Decoded, call: CallState):
        """The forward of a session model; NOT_FOUND, and the model forgotten, when its
        session is gone."""
        try:
            return await self.service.forward(model.session_id, decoded, call)
        except errors.Failure as failure:
            if failure.code is grpc.StatusCode.NOT_FOUND:
                db = self._db.get()
                with transaction(db):
                    db.execute(
                        "delete from models where owner = ? and name = ? and session_id = ?",
                        (call.identity, model.name, model.session_id),
                    )
                raise errors.not_found(
                    f"model {model.name}: its session expired, was evicted or released, or "
                    "the server restarted; load it again",
                    field="model_name",
                ) from None
            raise

    # ---- statistics of every worker together
    def record(self, model: Model, identity: str, ok: bool, ns: int) -> None:
        key = ("" if model.entry is not None else identity, model.name)
        with self._counting:
            self._counted.setdefault(key, Statistics()).record(ok, ns)
            due = time.monotonic() - self._counted_since >= STATISTICS_INTERVAL
        if due:
            self.flush_statistics()

    def flush_statistics(self) -> None:
        """Add what this worker counted to the server's statistics."""
        with self._counting:
            counted, self._counted = self._counted, {}
            self._counted_since = time.monotonic()
        if not counted:
            return
        db = self._db.get()
        with transaction(db):
            db.executemany(
                _ADD_STATISTICS,
                [
                    (owner, name, s.success_count, s.success_ns, s.fail_count, s.fail_ns, s.last_inference_ms)
                    for (owner, name), s in counted.items()
                ],
            )

    def statistics(self, listed: list[Model], identity: str) -> pb.ModelStatisticsResponse:
        self.flush_statistics()
        rows = {
            (owner, name): Statistics(*counts)
            for owner, name, *counts in self._db.get().execute(
                "select * from model_statistics where owner in ('', ?)", (identity,)
            )
        }
        return statistics(
            [(m, rows.get(("" if m.entry is not None else identity, m.name), Statistics())) for m in listed]
        )

    def index(self, identity: str, ready_only: bool) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for name in self.models:
            response.models.add(name=name, version=VERSION, state="READY")
        self.service.store.sweep()  # expired sessions show as such
        for model, live in self._session_models(identity):
            if live:
                response.models.add(name=model.name, version=VERSION, state="READY")
            elif not ready_only:
                response.models.add(
                    name=model.name,
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
        db = self._db.get()
        with transaction(db):
            db.execute(  # the caller's models whose sessions are gone meanwhile
                "delete from models where owner = ? and session_id not in (select id from sessions where owner = ?)",
                (call.identity, call.identity),
            )
            previous = db.execute(
                "select session_id from models where owner = ? and name = ?", (call.identity, name)
            ).fetchone()
            db.execute(
                "insert or replace into models (owner, name, session_id, n, k) values (?, ?, ?, ?, ?)",
                (call.identity, name, session.id, *session.shape),
            )
            if previous is not None:  # a new session: its statistics start again
                db.execute("delete from model_statistics where owner = ? and name = ?", (call.identity, name))
            db.execute(_FORGET_STATISTICS, (call.identity, call.identity))
        if previous is not None:  # a reload replaces the session
            with contextlib.suppress(errors.Failure):  # unless it is gone already
                self.service.store.release(previous[0], call.identity)

    def unload(self, name: str, identity: str) -> None:
        errors.check_length("model_name", name)
        if name in self.models:
            raise errors.invalid("model_name", f"{name!r} is an operation: only sessions are loaded and unloaded")
        db = self._db.get()
        with transaction(db):
            gone = db.execute(
                "delete from models where owner = ? and name = ? returning session_id", (identity, name)
            ).fetchone()
            db.execute(_FORGET_STATISTICS, (identity, identity))
        if gone is None:
            raise errors.not_found(f"no session model named {name!r}", field="model_name")
        with contextlib.suppress(errors.Failure):  # it expired or was evicted meanwhile: unloaded all the same
            self.service.store.release(gone[0], identity)
