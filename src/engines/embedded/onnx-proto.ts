/**
 * A minimal protobuf encoder for the subset of onnx.proto that our graphs use
 * (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto).
 * Hand-written because it is ~100 lines with no dependency, and its output is
 * bit-identical to onnx-proto's (checked byte for byte during the engine's feasibility study).
 * Field numbers are from onnx/onnx.proto; changing one silently breaks the model.
 */

export const ElemType = { FLOAT: 1, INT32: 6, INT64: 7, BOOL: 9 } as const;
export type ElemTypeValue = (typeof ElemType)[keyof typeof ElemType];

export type AttrValue =
  | { kind: "int"; value: number }
  | { kind: "float"; value: number }
  | { kind: "ints"; value: number[] }
  | { kind: "string"; value: string }
  | { kind: "tensor"; value: TensorDef };

export interface TensorDef {
  name?: string;
  dims: number[];
  dataType: ElemTypeValue;
  /** Little-endian raw bytes. */
  raw: Uint8Array;
}

export interface NodeDef {
  opType: string;
  inputs: string[];
  outputs: string[];
  name: string;
  attributes: Record<string, AttrValue>;
  domain?: string;
}

export interface ValueInfoDef {
  name: string;
  elemType: ElemTypeValue;
  /** A number is a fixed dim, a string a symbolic one. */
  dims: (number | string)[];
}

export interface ModelDef {
  irVersion: number;
  opsetVersion: number;
  producer: string;
  graphName: string;
  nodes: NodeDef[];
  inputs: ValueInfoDef[];
  outputs: ValueInfoDef[];
  initializers: TensorDef[];
}

class Writer {
  private chunks: number[] = [];
  private parts: Uint8Array[] = [];

  varint(value: number | bigint): this {
    // int64 fields are two's complement: negatives (axis -1) take 10 bytes.
    let v = BigInt.asUintN(64, BigInt(value));
    while (v >= 0x80n) {
      this.chunks.push(Number(v & 0x7fn) | 0x80);
      v >>= 7n;
    }
    this.chunks.push(Number(v));
    return this;
  }
  private flush(): void {
    if (this.chunks.length) this.parts.push(Uint8Array.from(this.chunks));
    this.chunks = [];
  }
  tag(field: number, wire: number): this {
    return this.varint((field << 3) | wire);
  }
  int(field: number, value: number): this {
    return this.tag(field, 0).varint(value);
  }
  float(field: number, value: number): this {
    this.tag(field, 5);
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, value, true);
    this.chunks.push(...b);
    return this;
  }
  bytes(field: number, data: Uint8Array): this {
    this.tag(field, 2).varint(data.length);
    this.flush();
    this.parts.push(data);
    return this;
  }
  string(field: number, s: string): this {
    return this.bytes(field, new TextEncoder().encode(s));
  }
  message(field: number, build: (w: Writer) => void): this {
    const inner = new Writer();
    build(inner);
    return this.bytes(field, inner.finish());
  }
  finish(): Uint8Array {
    this.flush();
    const total = this.parts.reduce((n, p) => n + p.length, 0);
    const out = new Uint8Array(total);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

function writeTensor(w: Writer, t: TensorDef): void {
  for (const d of t.dims) w.int(1, d); // dims
  w.int(2, t.dataType); // data_type
  if (t.name) w.string(8, t.name); // name
  w.bytes(9, t.raw); // raw_data
}

function writeAttribute(w: Writer, name: string, a: AttrValue): void {
  w.string(1, name);
  switch (a.kind) {
    case "float":
      w.float(2, a.value).int(20, 1);
      break;
    case "int":
      w.int(3, a.value).int(20, 2);
      break;
    case "string":
      w.string(4, a.value).int(20, 3);
      break;
    case "tensor":
      w.message(5, (t) => writeTensor(t, a.value)).int(20, 4);
      break;
    case "ints":
      for (const v of a.value) w.int(8, v);
      w.int(20, 7);
      break;
  }
}

function writeValueInfo(w: Writer, v: ValueInfoDef): void {
  w.string(1, v.name);
  w.message(2, (type) =>
    type.message(1, (tensorType) => {
      tensorType.int(1, v.elemType);
      tensorType.message(2, (shape) => {
        for (const d of v.dims) shape.message(1, (dim) => (typeof d === "number" ? dim.int(1, d) : dim.string(2, d)));
      });
    }),
  );
}

/** Serialize a ModelProto. */
export function encodeModel(m: ModelDef): Uint8Array {
  const w = new Writer();
  w.int(1, m.irVersion); // ir_version
  w.string(2, m.producer); // producer_name
  w.message(7, (g) => {
    for (const n of m.nodes) {
      g.message(1, (node) => {
        for (const i of n.inputs) node.string(1, i);
        for (const o of n.outputs) node.string(2, o);
        node.string(3, n.name);
        node.string(4, n.opType);
        for (const [k, v] of Object.entries(n.attributes)) node.message(5, (a) => writeAttribute(a, k, v));
        if (n.domain) node.string(7, n.domain);
      });
    }
    g.string(2, m.graphName);
    for (const t of m.initializers) g.message(5, (tw) => writeTensor(tw, t));
    for (const i of m.inputs) g.message(11, (vw) => writeValueInfo(vw, i));
    for (const o of m.outputs) g.message(12, (vw) => writeValueInfo(vw, o));
  });
  w.message(8, (op) => op.string(1, "").int(2, m.opsetVersion)); // opset_import (default domain)
  return w.finish();
}
