import { describe, expect, it } from "vitest";
import { assembleSample, maskStale, sampleStaleness, type SegmentFact } from "./sample.ts";
import { judgeStaleness, maskMinVersion, oldestAllowedVersion, stalenessHistogram, stalenessRule, type StalenessRule } from "./staleness.ts";

function seg(
  sampleIndex: number,
  segmentIndex: number,
  round: number,
  weightVersion: number,
  tokens: number[],
  lossMask = tokens.map(() => 1),
  status: SegmentFact["status"] = "aborted",
): SegmentFact {
  return {
    sampleIndex,
    segmentIndex,
    round,
    weightVersion,
    tokens,
    logProbs: tokens.map(() => -1),
    lossMask,
    finishReason: status === "aborted" ? "abort" : "stop",
    status,
    engine: "e",
  };
}

describe("assembleSample with staleness", () => {
  it("reports the oldest version among trained tokens, ignoring tool tokens (mask 0)", () => {
    const s = assembleSample(0, [seg(0, 0, 0, 3, [1, 2], [0, 0]), seg(0, 1, 1, 4, [3]), seg(0, 2, 2, 5, [4], [1], "completed")]);
    expect(s.oldestVersion).toBe(4);
    expect(s.tokenVersions).toEqual([-1, -1, 4, 5]);
    expect(sampleStaleness(s, 6)).toBe(2);
  });

  it("mask_offpolicy masking takes earlier rounds out of the oldest version too", () => {
    const s = assembleSample(0, [seg(0, 0, 0, 1, [1, 2]), seg(0, 1, 1, 2, [3], [1], "completed")], { maskBeforeRound: 1 });
    expect(s.lossMask).toEqual([0, 0, 1]);
    expect(s.oldestVersion).toBe(2);
  });

  it("a cut drops the sample's segments before the cut round but keeps their segment indices taken", () => {
    const segments = [seg(0, 0, 0, 1, [1, 2]), seg(0, 1, 1, 2, [3]), seg(0, 2, 2, 3, [9], [1], "completed")];
    const cut = assembleSample(0, segments, { cutBeforeRound: 2 });
    expect(cut.responseTokens).toEqual([9]);
    expect(cut.numSegments).toBe(1);
    expect(cut.nextSegmentIndex).toBe(3);
    expect(cut.oldestVersion).toBe(3);
    // Cut with nothing regenerated yet: the sample is pending from its prompt.
    const fresh = assembleSample(0, segments.slice(0, 2), { cutBeforeRound: 2 });
    expect(fresh).toMatchObject({ responseTokens: [], status: "pending", nextSegmentIndex: 2, oldestVersion: null });
  });

  it("observation images follow the counted segments in order; a cut drops those of the segments it drops", () => {
    const img = (sha: string) => ({
      type: "image",
      key: "observation",
      sha256: sha,
      byteLength: 1,
      mime: "image/png",
      origin: "bytes" as const,
      path: sha,
      source: null,
    });
    const segments = [
      { ...seg(0, 0, 0, 1, [1, 2], [1, 0]), images: [img("a")] },
      { ...seg(0, 1, 1, 2, [3, 4], [1, 0]), images: [img("b"), img("c")] },
      seg(0, 2, 2, 3, [9], [1], "completed"),
    ];
    expect(assembleSample(0, segments).images?.map((i) => i.sha256)).toEqual(["a", "b", "c"]);
    expect(assembleSample(0, segments, { cutBeforeRound: 1 }).images?.map((i) => i.sha256)).toEqual(["b", "c"]);
    expect(assembleSample(0, segments, { cutBeforeRound: 2 })).not.toHaveProperty("images");
  });

  it("maskStale zeroes tokens older than minVersion and keeps the denominator mask", () => {
    const s = assembleSample(0, [seg(0, 0, 0, 1, [1, 2]), seg(0, 1, 1, 2, [3], [0]), seg(0, 2, 2, 3, [4, 5], [1, 1], "completed")]);
    const m = maskStale(s, 3);
    expect(m.lossMask).toEqual([0, 0, 0, 1, 1]);
    expect(m.denomMask).toEqual([1, 1, 0, 1, 1]);
    expect(m.oldestVersion).toBe(3);
    expect(maskStale(s, 1)).toBe(s); // nothing stale: unchanged
    expect(maskStale(s, null)).toBe(s);
  });
});

describe("the staleness rule", () => {
  const rule = (over: Partial<StalenessRule>): StalenessRule => ({ maxStaleness: 1, policy: "drop", maxRegenerations: 2, ...over });
  const samples = [
    assembleSample(0, [seg(0, 0, 0, 3, [1], [1], "completed")]),
    assembleSample(1, [seg(1, 0, 0, 1, [1]), seg(1, 1, 1, 3, [2], [1], "completed")]),
    assembleSample(2, [], null),
  ];

  it("takes slime's defaults from a slime config, and k = 1 for train_async without a bound", () => {
    expect(stalenessRule({ max_staleness: null, train_async: false, staleness_policy: "keep", max_regenerations: 2 }).maxStaleness).toBeNull();
    expect(stalenessRule({ max_staleness: null, train_async: true, staleness_policy: "keep", max_regenerations: 2 }).maxStaleness).toBe(1);
    expect(stalenessRule({ max_staleness: 3, train_async: true, staleness_policy: "mask", max_regenerations: 2 }).maxStaleness).toBe(3);
  });

  it("step s trains from version s: the oldest allowed version is s - k", () => {
    expect(oldestAllowedVersion(rule({}), 4)).toBe(3);
    expect(oldestAllowedVersion(rule({ maxStaleness: null }), 4)).toBeNull();
    expect(maskMinVersion(rule({ policy: "mask" }), 4)).toBe(3);
    expect(maskMinVersion(rule({ policy: "drop" }), 4)).toBeNull();
  });

  it("drop cuts exactly the stale samples, then discards after max_regenerations", () => {
    // Step 4, k = 1: versions below 3 are stale; sample 1 started at version 1.
    expect(judgeStaleness(samples, 4, rule({}), 0)).toEqual({
      kind: "cut",
      samples: [1],
      reason: "stale: 1 sample(s) up to 3 versions stale for step 4 (max_staleness 1)",
    });
    expect(judgeStaleness(samples, 4, rule({}), 2)).toEqual({
      kind: "discard",
      reason: "stale: 1 sample(s) up to 3 versions stale for step 4 (max_staleness 1), after 2 regeneration(s)",
    });
    expect(judgeStaleness(samples, 2, rule({}), 0)).toEqual({ kind: "train" });
  });

  it("keep and mask always train; no bound never judges", () => {
    expect(judgeStaleness(samples, 9, rule({ policy: "keep" }), 0)).toEqual({ kind: "train" });
    expect(judgeStaleness(samples, 9, rule({ policy: "mask" }), 0)).toEqual({ kind: "train" });
    expect(judgeStaleness(samples, 9, rule({ maxStaleness: null }), 0)).toEqual({ kind: "train" });
  });

  it("counts a step's samples by staleness over their trained tokens", () => {
    const hist = stalenessHistogram(
      [
        { tokenVersions: [3, 3], lossMask: [1, 1] },
        { tokenVersions: [1, 3], lossMask: [0, 1] }, // masked stale token: not counted
        { tokenVersions: [1, 3], lossMask: [1, 1] },
        { tokenVersions: [], lossMask: [] },
      ],
      4,
    );
    expect([...hist].sort()).toEqual([
      [0, 1],
      [1, 2],
      [3, 1],
    ]);
  });
});
