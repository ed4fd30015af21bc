"""The KServe V2 / Triton inference protocol, `inference.GRPCInferenceService`, on the port
of tensorops.v1, so that Triton's clients (tritonclient and the C++, Go and Java ones)
call the kernels unchanged. docs/kserve.md is the user's guide.

Models (models.py):

- every operation of the op table is a model of the same name (`softmax`, ...), version
  "1", always ready. Its tensor arguments (the Tensor fields of its tensorops.v1 request)
  are its inputs; its other arguments are request parameters of the same names; its
  outputs are the Tensor fields of its response (`y`, `y0`/`y1`, `c`). eltwise's operands
  travel as one input `inputs`, stacked along a new first dimension.
- a quantized inner-product session is a model named by the caller (repository.py):
  RepositoryModelLoad creates it (the constructor's scalar arguments in the JSON `config`,
  its tensors as .npy files `file:b`, `file:b_scale`, `file:bias`), ModelInfer with input
  `a` runs its forward (output `c`), RepositoryModelUnload releases it. Like every session
  it belongs to its caller (auth.py) and expires or is evicted as the session store decides.

A request is converted once (conversion.py) into the native arguments of its operation,
by the table's rules and the functions that serve tensorops.v1, and computed by the very
code that serves tensorops.v1 (Service.operation and its sessions), inside the same call
pipeline (servicer.py): one place for arguments, limits, errors and metrics. Raw tensor
contents are used in place (views of the received message), and results are written once
into the response's `raw_output_contents`.

The messages come from proto/tensorops/kserve/v2 (package tensorops.kserve.v2, wire-
identical to Triton's `inference` package; that .proto says why the package differs).
"""

from tensorops.kserve import SERVICE_NAME

from .conversion import request_attributes
from .models import Model, operation_model
from .servicer import KServe, reflection_file

__all__ = ["SERVICE_NAME", "KServe", "Model", "operation_model", "reflection_file", "request_attributes"]
