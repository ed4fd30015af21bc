#!/usr/bin/env node
// Calling tensorops from Node.js with @grpc/grpc-js, from the .proto files alone
// (docs/protocol.md describes the contract):
//
//   cd examples/node && npm install && node example.js localhost:50051
//
// Three calls: a layer norm (FP32, NCHW), a softmax of a BF16 tensor, and a quantized inner
// product through a session (create, three forwards, describe, release); then a call the
// server refuses, to show the error details (google.rpc.BadRequest). The target may be one
// server or a balancer in front of several (deploy/envoy.yaml): the session's calls carry
// a routing key (x-tensorops-session-key) that keeps them on the replica holding it, and
// GetServerInfo says which replica answered (instance). The script prints one JSON document
// with every request tensor and every result tensor (raw little-endian bytes in base64), so
// that they can be checked bit for bit against any other implementation (the test suite
// compares them with tensorops_native: tests/e2e/test_node_example.py).
//
// Environment: TENSOROPS_TOKEN sends `authorization: Bearer <token>` (servers started with
// tokens require it); TENSOROPS_PROTO_DIR overrides the folder of the .proto files
// (default: ../../proto, this repository's).
'use strict';

const crypto = require('crypto');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const target = process.argv[2] || 'localhost:50051';
const protoDir = process.env.TENSOROPS_PROTO_DIR || path.join(__dirname, '..', '..', 'proto');

// keepCase: the field names of the .proto (b_scale, not bScale); enums as their names;
// int64 as JS numbers (shapes and sizes stay far below 2**53).
const definition = protoLoader.loadSync('tensorops/v1/tensorops.proto', {
  includeDirs: [protoDir],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: false,
  oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).tensorops.v1;

// The server accepts messages up to 64 MiB (ServerInfo.limits.max_message_bytes); grpc-js
// receives at most 4 MiB unless told otherwise.
const client = new v1.TensorOps(target, grpc.credentials.createInsecure(), {
  'grpc.max_send_message_length': 64 * 1024 * 1024,
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
});

// ---------------------------------------------------------------------------------------
// Tensors: shape, dtype, format (image tensors of operations with a layout only) and the
// elements as little-endian bytes in C order. BF16 is the upper half of the float32 bit
// pattern: 2 bytes per element.

const WRITERS = {
  DATA_TYPE_FP32: [4, (buf, v, at) => buf.writeFloatLE(v, at)],
  DATA_TYPE_BF16: [2, (buf, v, at) => buf.writeUInt16LE(bf16Bits(v), at)],
  DATA_TYPE_UINT8: [1, (buf, v, at) => buf.writeUInt8(v, at)],
  DATA_TYPE_INT8: [1, (buf, v, at) => buf.writeInt8(v, at)],
  DATA_TYPE_INT32: [4, (buf, v, at) => buf.writeInt32LE(v, at)],
};

const READERS = {
  DATA_TYPE_FP32: [4, (buf, at) => buf.readFloatLE(at)],
  DATA_TYPE_BF16: [2, (buf, at) => bf16Value(buf.readUInt16LE(at))],
  DATA_TYPE_UINT8: [1, (buf, at) => buf.readUInt8(at)],
  DATA_TYPE_INT8: [1, (buf, at) => buf.readInt8(at)],
  DATA_TYPE_INT32: [4, (buf, at) => buf.readInt32LE(at)],
};

// float -> BF16 bits, rounding to nearest even (NaN stays a quiet NaN).
function bf16Bits(value) {
  const f = Buffer.alloc(4);
  f.writeFloatLE(value);
  const u = f.readUInt32LE();
  if ((u & 0x7fffffff) > 0x7f800000) return (u >>> 16) | 0x40;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

function bf16Value(bits) {
  const f = Buffer.alloc(4);
  f.writeUInt32LE(bits << 16 >>> 0);
  return f.readFloatLE();
}

function tensor(values, shape, dtype, format) {
  const [size, write] = WRITERS[dtype];
  const data = Buffer.alloc(values.length * size);
  values.forEach((v, i) => write(data, v, i * size));
  const t = { shape, dtype, data };
  if (format) t.format = format;
  return t;
}

function values(t) {
  const [size, read] = READERS[t.dtype];
  const out = [];
  for (let at = 0; at < t.data.length; at += size) out.push(read(t.data, at));
  return out;
}

// A tensor as printed: bytes in base64 (and the first few values, for people).
function show(t) {
  return {
    shape: (t.shape || []).map(Number),
    dtype: t.dtype,
    format: t.format || 'FORMAT_UNSPECIFIED',
    data: Buffer.from(t.data).toString('base64'),
    first_values: values(t).slice(0, 4),
  };
}

// Deterministic inputs in [-1, 1).
function pseudoRandom(n, seed) {
  let state = seed >>> 0;
  return Array.from({ length: n }, () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 31 - 1;
  });
}

// ---------------------------------------------------------------------------------------
// Calls: promises over the callback API. Every call carries a deadline; metadata carries
// the bearer token (if any) and, for a session's calls, a routing key that lets a
// balancer send them all to the replica that holds the session.

function metadata(extra = {}) {
  const md = new grpc.Metadata();
  if (process.env.TENSOROPS_TOKEN) md.set('authorization', `Bearer ${process.env.TENSOROPS_TOKEN}`);
  for (const [key, value] of Object.entries(extra)) md.set(key, value);
  return md;
}

function call(method, request, md = metadata()) {
  return new Promise((resolve, reject) => {
    client[method](request, md, { deadline: Date.now() + 30000 }, (err, response) => {
      if (err) reject(describeError(method, err));
      else resolve(response);
    });
  });
}

// Error details: the trailer `grpc-status-details-bin` holds a serialized google.rpc.Status
// whose details are google.protobuf.Any messages; INVALID_ARGUMENT carries a
// google.rpc.BadRequest naming the field. The three messages, as protobufjs JSON.
const rpcTypes = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: { nested: { Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } } } },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            BadRequest: {
              fields: { field_violations: { rule: 'repeated', type: 'FieldViolation', id: 1 } },
              nested: {
                FieldViolation: { fields: { field: { type: 'string', id: 1 }, description: { type: 'string', id: 2 } } },
              },
            },
          },
        },
      },
    },
  },
});
const Status = rpcTypes.lookupType('google.rpc.Status');
const BadRequest = rpcTypes.lookupType('google.rpc.BadRequest');

// A failed call as an Error: code (grpc.status), message, and the field violations.
function describeError(method, err) {
  const error = new Error(`${method}: ${grpc.status[err.code]}: ${err.details}`);
  error.code = err.code;
  error.details = err.details;
  error.fieldViolations = [];
  const trailer = err.metadata && err.metadata.get('grpc-status-details-bin');
  if (trailer && trailer.length) {
    const status = Status.decode(trailer[0]);
    for (const any of status.details) {
      if (any.type_url === 'type.googleapis.com/google.rpc.BadRequest') {
        for (const v of BadRequest.decode(any.value).field_violations) {
          error.fieldViolations.push({ field: v.field, description: v.description });
        }
      }
    }
  }
  return error;
}

async function main() {
  const out = {};
  const info = await call('GetServerInfo', {});
  out.server = {
    version: info.version, isa: info.isa, max_message_bytes: info.limits.max_message_bytes, instance: info.instance,
  };

  // Layer norm across channels of an NCHW tensor: format is the image tensor's Format.
  const [n, c, h, w] = [2, 4, 3, 3];
  const layerNorm = {
    x: tensor(pseudoRandom(n * c * h * w, 1), [n, c, h, w], 'DATA_TYPE_FP32', 'FORMAT_NCHW'),
    scale: tensor(pseudoRandom(c, 2).map((v) => 1 + v / 2), [c], 'DATA_TYPE_FP32'),
    shift: tensor(pseudoRandom(c, 3), [c], 'DATA_TYPE_FP32'),
    eps: 1e-5,
  };
  const normed = await call('LayerNormChannels', layerNorm);
  out.layer_norm_channels = {
    request: { x: show(layerNorm.x), scale: show(layerNorm.scale), shift: show(layerNorm.shift), eps: layerNorm.eps },
    y: show(normed.y),
  };

  // Softmax of a BF16 tensor along its last axis: the result is BF16 too.
  const softmax = { x: tensor(pseudoRandom(3 * 8, 4).map((v) => 4 * v), [3, 8], 'DATA_TYPE_BF16'), axis: -1 };
  const probabilities = await call('Softmax', softmax);
  out.softmax_bf16 = { request: { x: show(softmax.x), axis: softmax.axis }, y: show(probabilities.y) };

  // Quantized inner product through a session: B (int8, K x N) and the quantization
  // parameters are sent once; each forward sends A (uint8, M x K) and gets C (uint8, M x N).
  // Every call of the session carries the same random routing key: behind a balancer they
  // all reach the replica that holds the session (elsewhere they would get NOT_FOUND).
  const [m, k, nOut] = [4, 16, 8];
  const routing = { 'x-tensorops-session-key': crypto.randomBytes(16).toString('hex') };
  const create = {
    b: tensor(pseudoRandom(k * nOut, 5).map((v) => Math.floor(v * 128)), [k, nOut], 'DATA_TYPE_INT8'),
    b_scale: tensor(pseudoRandom(nOut, 6).map((v) => 0.01 + v / 200), [nOut], 'DATA_TYPE_FP32'),
    a_scale: 0.05,
    a_zero: 128,
    c_scale: 0.5,
    c_zero: 128,
    bias: tensor(pseudoRandom(nOut, 7).map((v) => Math.floor(v * 1000)), [nOut], 'DATA_TYPE_INT32'),
    max_m: m,
  };
  const session = await call('CreateQuantizedInnerProduct', create, metadata(routing));
  try {
    const a = tensor(pseudoRandom(m * k, 8).map((v) => Math.floor((v + 1) * 128)), [m, k], 'DATA_TYPE_UINT8');
    const forwards = [];
    for (let i = 0; i < 3; i += 1) {
      forwards.push(await call('QuantizedInnerProductForward', { session_id: session.session_id, a }, metadata(routing)));
    }
    const described = await call('DescribeSession', { session_id: session.session_id }, metadata(routing));
    out.quantized_inner_product = {
      create: {
        b: show(create.b), b_scale: show(create.b_scale), bias: show(create.bias), a_scale: create.a_scale,
        a_zero: create.a_zero, c_scale: create.c_scale, c_zero: create.c_zero, max_m: create.max_m,
      },
      session: { info: session.info, n: session.n, k: session.k, max_m: session.max_m },
      forward: { a: show(a) },
      c: forwards.map((f) => show(f.c)),
      forward_count: described.forward_count,
    };
  } finally {
    await call('ReleaseSession', { session_id: session.session_id }, metadata(routing));
  }
  out.quantized_inner_product.released = true;

  // A refused call: an enum number the contract does not define. The status names the
  // field and lists the values the wire knows.
  try {
    await call('Unary', { x: tensor([1, 2], [2], 'DATA_TYPE_FP32'), op: 99 });
    throw new Error('Unary with op 99 succeeded');
  } catch (err) {
    if (err.code !== grpc.status.INVALID_ARGUMENT) throw err;
    out.invalid_argument = { code: grpc.status[err.code], message: err.details, field_violations: err.fieldViolations };
  }
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
}

main()
  .catch((err) => {
    console.error(err.message);
    for (const v of err.fieldViolations || []) console.error(`  field ${v.field}: ${v.description}`);
    process.exitCode = 1;
  })
  .finally(() => client.close());
