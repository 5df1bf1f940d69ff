/**
 * @file A request loaded in place under it (GenerateResult.versionSpans, engines/vllm-in-place.ts)
 * becomes one segment per version, and the assembled sample labels each token with its own.
 */
import { describe, expect, it } from "vitest";
import { splitAtVersions } from "./generate-group-round.ts";
import { generateResultSchema, spansCover } from "../engines/engine.ts";
import { assembleSample } from "../core/sample.ts";

const whole = {
  sampleIndex: 2,
  segmentIndex: 1,
  round: 3,
  tokenStart: 4,
  weightVersion: 5,
  tokens: [10, 11, 12, 13, 14],
  logProbs: [-0.1, -0.2, -0.3, -0.4, -0.5],
  lossMask: [1, 1, 1, 1, 1],
  finishReason: "stop",
  status: "completed" as const,
  engine: "http://e",
  error: null,
};

describe("splitAtVersions", () => {
  it("without spans the segment stays whole", () => {
    expect(splitAtVersions(whole, undefined)).toEqual([whole]);
  });

  it("cuts at each span: consecutive segment indexes and offsets, one version each; only the last says how the request ended", () => {
    const parts = splitAtVersions(whole, [
      { version: 5, start: 0, end: 2 },
      { version: 6, start: 2, end: 5 },
    ]);
    expect(parts).toEqual([
      { ...whole, tokens: [10, 11], logProbs: [-0.1, -0.2], lossMask: [1, 1], finishReason: "abort", status: "aborted" },
      { ...whole, segmentIndex: 2, tokenStart: 6, weightVersion: 6, tokens: [12, 13, 14], logProbs: [-0.3, -0.4, -0.5], lossMask: [1, 1, 1] },
    ]);
    // Earlier segments of the sample (indexes 0) plus these: each token carries its own version.
    const first = { ...whole, segmentIndex: 0, tokenStart: 0, weightVersion: 4, tokens: [1, 2, 3, 4], logProbs: [-1, -1, -1, -1], lossMask: [1, 1, 1, 1] };
    const sample = assembleSample(2, [first, ...parts]);
    expect(sample.tokenVersions).toEqual([4, 4, 4, 4, 5, 5, 6, 6, 6]);
    expect(sample.status).toBe("completed");
  });
});

describe("versionSpans in a GenerateResult", () => {
  const result = { tokenIds: [1, 2, 3], logProbs: [-1, -1, -1], finishReason: "length", weightVersion: 0, engineId: "e" };

  it("must tile the tokens in order from weightVersion, versions rising", () => {
    expect(
      spansCover(
        [
          { version: 0, start: 0, end: 1 },
          { version: 1, start: 1, end: 3 },
        ],
        3,
        0,
      ),
    ).toBe(true);
    expect(
      generateResultSchema.safeParse({
        ...result,
        versionSpans: [
          { version: 0, start: 0, end: 1 },
          { version: 1, start: 1, end: 3 },
        ],
      }).success,
    ).toBe(true);
    for (const bad of [
      [
        { version: 0, start: 0, end: 1 },
        { version: 1, start: 2, end: 3 },
      ], // a gap
      [
        { version: 0, start: 0, end: 1 },
        { version: 1, start: 1, end: 2 },
      ], // short of the tokens
      [
        { version: 1, start: 0, end: 1 },
        { version: 2, start: 1, end: 3 },
      ], // not from weightVersion
      [
        { version: 0, start: 0, end: 1 },
        { version: 0, start: 1, end: 3 },
      ], // no version change
      [{ version: 0, start: 0, end: 3 }], // one span: no cut, so none is sent
    ])
      expect(generateResultSchema.safeParse({ ...result, versionSpans: bad }).success, JSON.stringify(bad)).toBe(false);
  });
});
