import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { decodeBatch, encodeBatch } from "./batch-codec.ts";
import { sha256Hex } from "../lib/hash.ts";
import { solidPng } from "../../test/helpers/png.ts";
import type { TrainSample } from "./trainer.ts";

function textSample(groupIndex: number, sampleIndex: number): TrainSample {
  return {
    tokens: Int32Array.from([256, 65, 66]),
    promptLength: 2,
    responseLength: 1,
    lossMask: Uint8Array.from([1]),
    rolloutLogProbs: Float32Array.from([-0.5]),
    tokenVersions: Int32Array.from([0]),
    reward: 1,
    groupIndex,
    sampleIndex,
  };
}

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

  it("reads a batch that lies inside a larger buffer (a Node Buffer from the pool, a subarray)", () => {
    const one = encodeBatch({ runId: "r", step: 1, samples: [textSample(0, 0), textSample(1, 0)] });
    const pool = new Uint8Array(one.byteLength + 24).fill(7);
    pool.set(one, 24);
    for (const bytes of [pool.subarray(24), Buffer.from(pool.buffer, 24, one.byteLength)]) {
      const back = decodeBatch(bytes);
      expect(back.samples.map((x) => [...x.tokens])).toEqual([[...textSample(0, 0).tokens], [...textSample(1, 0).tokens]]);
    }
  });

  it("rejects bytes that are not a batch", () => {
    expect(() => decodeBatch(new TextEncoder().encode("not a batch at all"))).toThrow(/magic/);
  });

  it("carries each distinct image once, read by reference and checked against its sha256", () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-batch-images-"));
    const red = solidPng([200, 0, 0]);
    const blue = solidPng([0, 0, 200], 3, 2);
    writeFileSync(join(dir, "red.png"), red);
    const redRef = { sha256: sha256Hex(red), mime: "image/png", path: join(dir, "red.png") };
    const blueRef = { sha256: sha256Hex(blue), mime: "image/png", bytes: new Uint8Array(blue) };
    const samples = [
      { ...textSample(0, 0), images: [redRef, blueRef] },
      { ...textSample(0, 1), images: [redRef, blueRef] },
      textSample(1, 0),
      { ...textSample(2, 0), images: [blueRef] },
    ];
    const bytes = Buffer.from(encodeBatch({ runId: "r", step: 0, samples }));
    // Five uses of two images: each distinct image's bytes once.
    const occurrences = (img: Buffer) => {
      let n = 0;
      for (let at = bytes.indexOf(img); at !== -1; at = bytes.indexOf(img, at + 1)) n++;
      return n;
    };
    expect([occurrences(red), occurrences(blue)]).toEqual([1, 1]);
    const back = decodeBatch(bytes); // a Node Buffer: its slices are views into a pool, which decodeBatch must not read from 0
    expect(back.samples.map((x) => x.images?.map((i) => i.sha256) ?? [])).toEqual([
      [redRef.sha256, blueRef.sha256],
      [redRef.sha256, blueRef.sha256],
      [],
      [blueRef.sha256],
    ]);
    expect(Buffer.from(back.samples[0]!.images![0]!.bytes!)).toEqual(red);
    expect(Buffer.from(back.samples[3]!.images![0]!.bytes!)).toEqual(blue);
    // A file that changed since the rollout read it is refused, naming it; so are bytes that are not the named image.
    writeFileSync(join(dir, "red.png"), blue);
    expect(() => encodeBatch({ runId: "r", step: 0, samples })).toThrow(/red\.png changed since the dataset was loaded/);
    expect(() => encodeBatch({ runId: "r", step: 0, samples: [{ ...textSample(0, 0), images: [{ ...blueRef, sha256: redRef.sha256 }] }] })).toThrow(
      /sample 0 of group 0: image bytes do not hash to/,
    );
  });
});
