import { describe, expect, it } from "vitest";
import { binaryArray } from "./pg-binary-array.ts";

describe("binaryArray (Postgres array_recv's wire format)", () => {
  it("concatenates the parts into one 1-D array: header, then length-prefixed big-endian elements", () => {
    const b = binaryArray("int4", [[1, -2], [], [70000]], "t");
    expect([...b.subarray(0, 20)]).toEqual([0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 23, 0, 0, 0, 3, 0, 0, 0, 1]);
    expect(b.length).toBe(20 + 3 * 8);
    expect([b.readInt32BE(20), b.readInt32BE(24), b.readInt32BE(28), b.readInt32BE(32), b.readInt32BE(36), b.readInt32BE(40)]).toEqual([4, 1, 4, -2, 4, 70000]);
  });

  it("float4 elements are the float nearest each number; int2 elements take two bytes", () => {
    const f = binaryArray("float4", [[-0.1, -Infinity]], "f");
    expect(f.readUInt32BE(8)).toBe(700);
    expect([f.readInt32BE(20), f.readFloatBE(24), f.readFloatBE(32)]).toEqual([4, Math.fround(-0.1), -Infinity]);
    const s = binaryArray("int2", [[-32768, 32767]], "s");
    expect([s.readUInt32BE(8), s.length, s.readInt32BE(20), s.readInt16BE(24), s.readInt16BE(30)]).toEqual([21, 20 + 2 * 6, 2, -32768, 32767]);
  });

  it("an empty array is zero dimensions, as Postgres writes '{}'", () => {
    const e = binaryArray("int2", [[], []], "e");
    expect([...e]).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 21]);
  });

  it("refuses a number its integer column cannot hold, naming what it was", () => {
    expect(() => binaryArray("int4", [[1, 2.5]], "a segment's tokens")).toThrow("a segment's tokens: 2.5 is not a 32-bit integer (int4)");
    expect(() => binaryArray("int4", [[2 ** 31]], "x")).toThrow(/2147483648 is not a 32-bit integer/);
    expect(() => binaryArray("int2", [[40000]], "a segment's loss mask")).toThrow("a segment's loss mask: 40000 is not a 16-bit integer (int2)");
    expect(() => binaryArray("int4", [[Number.NaN]], "x")).toThrow(/NaN is not a 32-bit integer/);
  });
});
