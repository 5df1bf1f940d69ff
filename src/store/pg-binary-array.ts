/**
 * One-dimensional Postgres arrays in the binary wire format (array_recv in
 * src/backend/utils/adt/arrayfuncs.c): node-postgres sends a Buffer parameter
 * with format code 1, so `$n::int4[]` given one of these is read by array_recv,
 * not parsed from text. For the per-token columns of a round write this
 * replaces an `{1,2,...}` literal per segment, which Postgres parsed number by
 * number (float4in for every log-prob) and node-postgres escaped element by
 * element.
 *
 * Layout: int32 ndim, int32 has-nulls (0), uint32 element type oid; for ndim 1,
 * int32 length and int32 lower bound (1); then per element int32 byte length
 * and the big-endian value. An empty array is ndim 0 and nothing after the oid.
 */

import { RlqError } from "../lib/errors.ts";

const OID = { int2: 21, int4: 23, float4: 700 } as const;
type ElementType = keyof typeof OID;
const SIZE: Record<ElementType, number> = { int2: 2, int4: 4, float4: 4 };

/** The concatenation of `parts`, as one binary array of `type`. */
export function binaryArray(type: ElementType, parts: ReadonlyArray<ArrayLike<number>>, what: string): Buffer {
  let n = 0;
  for (const p of parts) n += p.length;
  const size = SIZE[type];
  const buf = Buffer.allocUnsafe(n === 0 ? 12 : 20 + n * (4 + size));
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  v.setInt32(0, n === 0 ? 0 : 1);
  v.setInt32(4, 0);
  v.setUint32(8, OID[type]);
  if (n === 0) return buf;
  v.setInt32(12, n);
  v.setInt32(16, 1);
  let o = 20;
  for (const p of parts) {
    for (let i = 0; i < p.length; i++) {
      const x = p[i] as number;
      v.setInt32(o, size);
      if (type === "float4") v.setFloat32(o + 4, x);
      else {
        const ok = type === "int4" ? (x | 0) === x : (x << 16) >> 16 === x;
        if (!ok) throw new RlqError("invariant_violated", `${what}: ${String(x)} is not a ${type === "int4" ? "32" : "16"}-bit integer (${type})`);
        if (type === "int4") v.setInt32(o + 4, x);
        else v.setInt16(o + 4, x);
      }
      o += 4 + size;
    }
  }
  return buf;
}

/**
 * A per-row array column packed as one binary array: each row's slice is `col[at : at + len - 1]`
 * in SQL (1-based; an empty row's slice is `{}`, as its literal was).
 */
export function packedColumn(type: ElementType, what: string) {
  const parts: Array<readonly number[]> = [];
  const at: number[] = [];
  const len: number[] = [];
  let next = 1;
  return {
    at,
    len,
    push(xs: readonly number[]): void {
      at.push(next);
      len.push(xs.length);
      next += xs.length;
      parts.push(xs);
    },
    binary: (): Buffer => binaryArray(type, parts, what),
  };
}
