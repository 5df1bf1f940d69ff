import { describe, expect, it } from "vitest";
import { decodeBatch, encodeBatch } from "./batch-codec.ts";

describe("RLQB batch codec", () => {
  it("round-trips ragged samples, including an empty response", () => {
    const batch = {
      runId: "r1",
      step: 3,
      samples: [
        {
          tokens: Int32Array.from([256, 65, 66, 67]),
          promptLength: 2,
          responseLength: 2,
          lossMask: Uint8Array.from([1, 0]),
          denomMask: Uint8Array.from([1, 1]),
          rolloutLogProbs: Float32Array.from([-0.5, 0]),
          tokenVersions: Int32Array.from([2, -1]),
          reward: 1.5,
          groupIndex: 0,
          sampleIndex: 0,
        },
        {
          tokens: Int32Array.from([256, 70]),
          promptLength: 2,
          responseLength: 0,
          lossMask: new Uint8Array(0),
          rolloutLogProbs: new Float32Array(0),
          tokenVersions: new Int32Array(0),
          reward: -1,
          groupIndex: 1,
          sampleIndex: 0,
        },
      ],
    };
    const bytes = encodeBatch(batch);
    expect(new TextDecoder().decode(bytes.subarray(0, 4))).toBe("RLQB");
    const back = decodeBatch(bytes);
    expect(back.runId).toBe("r1");
    expect(back.step).toBe(3);
    expect(back.samples).toHaveLength(2);
    expect([...back.samples[0]!.tokens]).toEqual([256, 65, 66, 67]);
    expect([...back.samples[0]!.lossMask]).toEqual([1, 0]);
    // The denominators' mask travels too (the off-policy token counts in the sample's mean)...
    expect([...back.samples[0]!.denomMask!]).toEqual([1, 1]);
    expect([...back.samples[0]!.rolloutLogProbs]).toEqual([-0.5, 0]);
    expect([...back.samples[0]!.tokenVersions]).toEqual([2, -1]);
    expect(back.samples[1]!.responseLength).toBe(0);
    expect(back.samples[1]!.reward).toBe(-1);
    // ... and defaults to the loss mask when a sample has none.
    expect(back.samples[1]!.denomMask).toEqual(back.samples[1]!.lossMask);
  });

  it("rejects bytes that are not a batch", () => {
    expect(() => decodeBatch(new TextEncoder().encode("not a batch at all"))).toThrow(/magic/);
  });
});
