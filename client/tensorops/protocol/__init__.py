"""The protocol both ends of tensorops speak, public so that the server (and any other
Python program) can build on it without reaching into the client's private modules:

- `dtypes`: the one table of tensor datatypes (tensorops.v1 DataType, KServe name, NumPy
  dtype) and of image layouts;
- `codec`: NumPy arrays <-> tensorops.v1 messages, decoded in place and validated;
- `wire`: the operation table (every operation's RPC, messages, tensors, attributes and
  result) and the conversion of Python arguments to requests and of responses to results.
"""
