"""Coverage-guided fuzz target (atheris, libFuzzer) for the wire decoder: tensorops.codec.

An input is one byte choosing the message class (every request and response message of
tensorops.v1.TensorOps; MessageCodec.decode serves both sides) followed by the bytes of the
message. Each input is decoded by both paths of MessageCodec.decode (decode_in_place, which
large messages take, and decode_with_protobuf, which small ones take) and by protobuf's
own parser, and every decoded tensor goes through to_array with a size limit
(tests/support/wire_cases.py, check). A crash is any disagreement between them or any
exception other than WireError from the codec.

    make fuzz-codec FUZZ_SECONDS=60                          # seeds a corpus, then fuzzes
    export PYTHONPATH=tests/support                          # wire_cases, shared with the tests
    .venv/bin/python tests/fuzz/fuzz_codec.py CORPUS -max_total_time=3600 -fork=2
    .venv/bin/python tests/fuzz/fuzz_codec.py CRASH_FILE     # runs one input again
    .venv/bin/python tests/fuzz/fuzz_codec.py --seeds CORPUS # writes the seed inputs

docs/security-testing.md has more.
"""

import hashlib
import pathlib
import shlex
import sys

import atheris

# The tensorops package is instrumented (the codec's Python code is what the inputs reach
# and the coverage feedback steers); protobuf's parser is C.
with atheris.instrument_imports(include=["tensorops"]):
    from tensorops.protocol import codec

import numpy as np

from wire_cases import CASES, CODECS, MESSAGE_CLASSES, check, encode


def test_one_input(data: bytes) -> None:
    if data:
        check(CODECS[MESSAGE_CLASSES[data[0] % len(MESSAGE_CLASSES)]], data[1:])


def seeds():
    """The hand-written cases, and for every message class with Tensor fields a message as
    each encoder writes it (the small one through protobuf, the large one with padding)."""
    for _, cls, raw, _ in CASES:
        yield bytes([MESSAGE_CLASSES.index(cls)]) + raw
    for index, cls in enumerate(MESSAGE_CLASSES):
        message_codec = CODECS[cls]
        tensors = {
            name: codec.encode_tensor(np.arange(6, dtype=np.float32).reshape(2, 3), name, 1)
            for name in message_codec.numbers
        }
        tensors.update({name: [tensors[name]] * 2 for name in message_codec.repeated})
        for in_place in (False, True):
            yield bytes([index]) + encode(message_codec, cls(), tensors, in_place=in_place)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        corpus = pathlib.Path(sys.argv[2])
        corpus.mkdir(parents=True, exist_ok=True)
        for data in seeds():
            (corpus / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
        return
    # libFuzzer's -jobs and -fork start argv[0] again through the shell: this interpreter
    # with this script, not the script alone.
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(pathlib.Path(__file__).resolve()))}"
    atheris.Setup([command] + sys.argv[1:], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
