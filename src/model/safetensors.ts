/**
 * safetensors, written and read by hand (https://github.com/huggingface/safetensors):
 *   [u64 LE header length N][N bytes JSON header, space-padded to 8][raw little-endian tensor bytes]
 * The header maps each tensor name to {dtype, shape, data_offsets: [begin, end)} relative
 * to the start of the data section, plus "__metadata__": a string -> string map.
 *
 * Deterministic by construction: tensors are laid out in the order given and the
 * header is JSON.stringify of objects built in that order, so the same tensors
 * and metadata give byte-identical files (a retried train step relies on this).
 */

import { endianness } from "node:os";
import { RlqError } from "../lib/errors.ts";

export type SafetensorsDtype = "F32" | "F64" | "I32";
export type TensorData = Float32Array | Float64Array | Int32Array;

export interface NamedTensor {
  name: string;
  shape: number[];
  data: TensorData;
}

export interface SafetensorsFile {
  metadata: Record<string, string>;
  tensors: Map<string, NamedTensor>;
}

const BYTES: Record<SafetensorsDtype, number> = { F32: 4, F64: 8, I32: 4 };

function dtypeOf(data: TensorData): SafetensorsDtype {
  if (data instanceof Float32Array) return "F32";
  if (data instanceof Float64Array) return "F64";
  return "I32";
}

function assertLittleEndian(): void {
  // Typed arrays use host byte order; safetensors is little-endian. Every
  // platform Node ships on is LE, but fail loudly rather than write garbage.
  if (endianness() !== "LE") throw new RlqError("model_invalid", "safetensors: big-endian hosts are not supported");
}

/** Serialize tensors (in the given order) and string metadata. */
export function encodeSafetensors(tensors: readonly NamedTensor[], metadata: Record<string, string>): Uint8Array {
  assertLittleEndian();
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const t of tensors) {
    if (t.name === "__metadata__" || t.name in header) throw new RlqError("model_invalid", `safetensors: duplicate or reserved name "${t.name}"`);
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) throw new RlqError("model_invalid", `safetensors: "${t.name}" has ${t.data.length} values for shape [${t.shape.join(", ")}]`);
    header[t.name] = { dtype: dtypeOf(t.data), shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const headerBytes = Buffer.from(json, "utf8");
  const out = new Uint8Array(8 + headerBytes.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const t of tensors) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at);
    at += t.data.byteLength;
  }
  return out;
}

function parseHeaderEntry(name: string, entry: unknown): { dtype: SafetensorsDtype; shape: number[]; begin: number; end: number } {
  const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
  if (typeof e !== "object" || e === null) throw new RlqError("model_invalid", `safetensors: bad header entry for "${name}"`);
  if (e.dtype !== "F32" && e.dtype !== "F64" && e.dtype !== "I32") {
    throw new RlqError("model_invalid", `safetensors: "${name}" has dtype ${String(e.dtype)}, expected F32, F64 or I32`);
  }
  if (!Array.isArray(e.shape) || !e.shape.every((d) => Number.isInteger(d) && d >= 0))
    throw new RlqError("model_invalid", `safetensors: bad shape for "${name}"`);
  const offsets = e.data_offsets;
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isInteger(o))) {
    throw new RlqError("model_invalid", `safetensors: bad data_offsets for "${name}"`);
  }
  return { dtype: e.dtype, shape: e.shape as number[], begin: offsets[0] as number, end: offsets[1] as number };
}

/** Parse a safetensors buffer. Tensor data is copied out, so the result does not alias `bytes`. */
export function decodeSafetensors(bytes: Uint8Array): SafetensorsFile {
  assertLittleEndian();
  if (bytes.length < 8) throw new RlqError("model_invalid", "safetensors: file shorter than its 8-byte header length");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  if (8 + headerLength > bytes.length) throw new RlqError("model_invalid", "safetensors: header length exceeds file size");
  const header = JSON.parse(Buffer.from(bytes.subarray(8, 8 + headerLength)).toString("utf8")) as Record<string, unknown>;
  const dataStart = 8 + headerLength;
  const metadata: Record<string, string> = {};
  const rawMeta = header.__metadata__;
  if (rawMeta && typeof rawMeta === "object") {
    for (const [k, v] of Object.entries(rawMeta)) if (typeof v === "string") metadata[k] = v;
  }
  const tensors = new Map<string, NamedTensor>();
  for (const [name, entry] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const { dtype, shape, begin, end } = parseHeaderEntry(name, entry);
    const count = shape.reduce((a, b) => a * b, 1);
    if (end - begin !== count * BYTES[dtype] || dataStart + end > bytes.length) {
      throw new RlqError("model_invalid", `safetensors: "${name}" data_offsets [${begin}, ${end}) do not match shape or file size`);
    }
    // Copy into a fresh, aligned ArrayBuffer (offsets in the file need not be aligned).
    // Not bytes.slice(): on a Node Buffer that is a view, not a copy.
    const raw = new Uint8Array(bytes.subarray(dataStart + begin, dataStart + end)).buffer;
    const data = dtype === "F32" ? new Float32Array(raw) : dtype === "F64" ? new Float64Array(raw) : new Int32Array(raw);
    tensors.set(name, { name, shape, data });
  }
  return { metadata, tensors };
}
