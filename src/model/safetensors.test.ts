import { describe, expect, it } from "vitest";
import { decodeSafetensors, encodeSafetensors } from "./safetensors.ts";

describe("safetensors", () => {
  it("round-trips tensors and metadata in the documented layout", () => {
    const tensors = [
      { name: "a", shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, -6.5]) },
      { name: "b.c", shape: [3], data: Int32Array.from([7, -8, 9]) },
      { name: "d", shape: [1], data: Float64Array.from([Math.PI]) },
    ];
    const bytes = encodeSafetensors(tensors, { version: "3", config: '{"x":1}' });
    const headerLength = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    expect(headerLength % 8).toBe(0);
    const header = JSON.parse(Buffer.from(bytes.subarray(8, 8 + headerLength)).toString());
    expect(header.a).toEqual({ dtype: "F32", shape: [2, 3], data_offsets: [0, 24] });
    expect(header["b.c"]).toEqual({ dtype: "I32", shape: [3], data_offsets: [24, 36] });
    expect(header.__metadata__).toEqual({ version: "3", config: '{"x":1}' });
    const back = decodeSafetensors(bytes);
    expect(back.metadata).toEqual({ version: "3", config: '{"x":1}' });
    for (const t of tensors) expect(back.tensors.get(t.name)).toEqual(t);
  });

  it("is byte-deterministic and rejects inconsistent input", () => {
    const t = [{ name: "w", shape: [2], data: Float32Array.from([0.1, 0.2]) }];
    expect(encodeSafetensors(t, { k: "v" })).toEqual(encodeSafetensors(t, { k: "v" }));
    expect(() => encodeSafetensors([{ name: "w", shape: [3], data: new Float32Array(2) }], {})).toThrow(/shape/);
    const bytes = encodeSafetensors(t, {});
    expect(() => decodeSafetensors(bytes.subarray(0, bytes.length - 1))).toThrow(/data_offsets/);
  });

  it("decodes from a Node Buffer whose data offsets are unaligned", () => {
    const bytes = encodeSafetensors(
      [
        { name: "x", shape: [1], data: Int32Array.of(1) },
        { name: "y", shape: [2], data: Float64Array.of(1.5, 2.5) },
      ],
      {},
    );
    const buf = Buffer.concat([Buffer.alloc(3), Buffer.from(bytes)]).subarray(3);
    expect(Array.from(decodeSafetensors(buf).tensors.get("y")!.data)).toEqual([1.5, 2.5]);
  });
});
