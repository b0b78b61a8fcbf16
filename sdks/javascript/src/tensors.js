// Tensors on the wire: the Open Inference Protocol's, sent and received as binary data (the
// protocol's binary extension), so every dtype crosses exactly, int64 included. In
// JavaScript a tensor is {shape, dtype, data} with `data` a typed array:

import { DeepxError, shown } from "./errors.js";

/** dtype -> [the protocol's datatype, the typed array holding its values]. float16 and
 * bfloat16 travel as their 16-bit patterns (Uint16Array; `toFloat32` converts), bool as
 * bytes of 0 and 1 (Uint8Array), int64 and uint64 as BigInt64Array and BigUint64Array. */
export const WIRE = {
  bool: ["BOOL", Uint8Array], int8: ["INT8", Int8Array], int16: ["INT16", Int16Array],
  int32: ["INT32", Int32Array], int64: ["INT64", BigInt64Array], uint8: ["UINT8", Uint8Array],
  uint16: ["UINT16", Uint16Array], uint32: ["UINT32", Uint32Array],
  uint64: ["UINT64", BigUint64Array], float16: ["FP16", Uint16Array],
  bfloat16: ["BF16", Uint16Array], float32: ["FP32", Float32Array],
  float64: ["FP64", Float64Array],
};
const DTYPE_OF = Object.fromEntries(Object.entries(WIRE).map(([d, [w]]) => [w, d]));
const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A tensor of `dtype` (default: from a typed array's kind, else float32) and `shape`
 * (default: 1-D) holding `data` (a typed array, or an array of numbers, bigints or bools). */
export function tensor(data, shape = undefined, dtype = undefined) {
  dtype = dtype ?? dtypeOfArray(data) ?? "float32";
  if (!(dtype in WIRE)) throw new DeepxError(`unknown dtype ${shown(dtype)}`, { kind: "InputError" });
  const Kind = WIRE[dtype][1];
  if ((dtype === "float16" || dtype === "bfloat16") && !(data instanceof Uint16Array)) {
    // (numbers would be taken for bit patterns: their values are given as the patterns)
    throw new DeepxError(`${dtype} values are given as a Uint16Array of their 16-bit patterns`,
      { kind: "InputError" });
  }
  let values = data;
  if (!(data instanceof Kind)) {
    if (!Array.isArray(data) && !ArrayBuffer.isView(data)) {
      throw new DeepxError(`a tensor's data is a typed array or an array, not ${shown(typeof data)}`,
        { kind: "InputError" });
    }
    values = Kind.from(data, (v) => exact(v, dtype, Kind));
  }
  shape = shape ?? [values.length];
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
    throw new DeepxError(`a shape is a list of non-negative integers, not ${shown(String(shape))}`,
      { kind: "InputError" });
  }
  const size = shape.reduce((a, b) => a * b, 1);
  if (size !== values.length) {
    throw new DeepxError(`${values.length} values, but shape [${shape}] holds ${size}`, { kind: "InputError" });
  }
  return { shape: [...shape], dtype, data: values };
}

function dtypeOfArray(data) {
  for (const [dtype, [, Kind]] of Object.entries(WIRE)) {
    if (data instanceof Kind && !["bool", "float16", "bfloat16"].includes(dtype)) return dtype;
  }
  return undefined;
}

function exact(value, dtype, Kind) {
  // a value the typed array would change (round, wrap, or make NaN) is refused, not stored
  if (Kind === BigInt64Array || Kind === BigUint64Array) {
    const big = typeof value === "bigint" ? value : (Number.isSafeInteger(value) ? BigInt(value) : undefined);
    const [lo, hi] = Kind === BigInt64Array ? [-(2n ** 63n), 2n ** 63n - 1n] : [0n, 2n ** 64n - 1n];
    if (big === undefined || big < lo || big > hi) {
      throw new DeepxError(`${shown(String(value))} is not a ${dtype} value`, { kind: "InputError" });
    }
    return big;
  }
  if (dtype === "bool") {
    if (value === true || value === false || value === 0 || value === 1) return Number(value);
    throw new DeepxError(`${shown(String(value))} is not a bool value`, { kind: "InputError" });
  }
  if (typeof value !== "number") {
    throw new DeepxError(`${shown(String(value))} is not a number`, { kind: "InputError" });
  }
  if (Kind === Float64Array || Kind === Float32Array) {
    if (Kind === Float32Array && Number.isFinite(value) && !Number.isFinite(Math.fround(value))) {
      throw new DeepxError(`${value} is beyond float32's range`, { kind: "InputError" });
    }
    return value;
  }
  const probe = Kind.from([value])[0];
  if (probe !== value) {
    throw new DeepxError(`${value} is not a ${dtype} value`, { kind: "InputError" });
  }
  return value;
}

/** The 16-bit patterns of a float16 or bfloat16 tensor as float32 values. */
export function toFloat32(t) {
  const out = new Float32Array(t.data.length);
  if (t.dtype === "bfloat16") {
    const wide = new Uint32Array(out.buffer);
    t.data.forEach((bits, i) => { wide[i] = bits << 16; });
    return out;
  }
  if (t.dtype !== "float16") throw new DeepxError(`${t.dtype} is not a 16-bit float`, { kind: "InputError" });
  t.data.forEach((bits, i) => {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const fraction = bits & 0x3ff;
    out[i] = exponent === 0 ? sign * 2 ** -14 * (fraction / 1024)
      : exponent === 31 ? (fraction ? NaN : sign * Infinity)
        : sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
  });
  return out;
}

/** The raw little-endian bytes of a tensor's data. */
export function rawBytes(t) {
  const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  if (LITTLE || t.data.BYTES_PER_ELEMENT === 1) return bytes;
  const out = new Uint8Array(bytes.length);
  const size = t.data.BYTES_PER_ELEMENT;
  for (let i = 0; i < bytes.length; i += size) for (let j = 0; j < size; j++) out[i + j] = bytes[i + size - 1 - j];
  return out;
}

/** A tensor from the protocol's description of one and its raw bytes. */
export function fromRaw(entry, bytes) {
  const dtype = DTYPE_OF[entry.datatype];
  if (dtype === undefined) {
    throw new DeepxError(`the gateway sent datatype ${shown(entry.datatype)}`, { kind: "RemoteError" });
  }
  const Kind = WIRE[dtype][1];
  const size = entry.shape.reduce((a, b) => a * b, 1);
  if (bytes.length !== size * Kind.BYTES_PER_ELEMENT) {
    throw new DeepxError(`output ${shown(entry.name)}: the gateway sent ${bytes.length} bytes for ` +
      `${dtype}[${entry.shape}]`, { kind: "RemoteError" });
  }
  const copy = new Uint8Array(bytes); // (aligned, and the answer's buffer released)
  if (!LITTLE && Kind.BYTES_PER_ELEMENT > 1) copy.reverse();
  let data = new Kind(copy.buffer, 0, copy.length / Kind.BYTES_PER_ELEMENT);
  if (!LITTLE && Kind.BYTES_PER_ELEMENT > 1) data = data.reverse();
  return { shape: entry.shape, dtype, data };
}
