import { describe, expect, it } from "vitest";
import { computeMisWeights, type MisOptions } from "./mis.ts";

const close = (actual: ArrayLike<number> | undefined, expected: number[], digits = 12): void => {
  expect(actual?.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual?.[i]).toBeCloseTo(v, digits));
};
const arr = (x: ArrayLike<number> | undefined): number[] => Array.from(x ?? []);

const BASE: MisOptions = {
  tis_level: "token",
  tis_mode: "truncate",
  tis_lower_bound: 0.5,
  tis_upper_bound: 2,
  use_rs: false,
  rs_level: "token",
  rs_lower_bound: null,
  rs_upper_bound: null,
  rs_veto_threshold: null,
  tis_batch_normalize: false,
};

// Sample A: old - rollout = [ln 3, 0, ln 0.5, ln 5], mask [1, 1, 1, 0] -> token ratios [3, 1, 0.5, 5].
// Rollout log-probs 0 keep exp(ln 0.5) exactly 0.5, so the closed-interval bound checks are exact.
const ROL = [[0, 0, 0, 0]];
const OLD = [[Math.log(3), 0, Math.log(0.5), Math.log(5)]];
const MASK = [[1, 1, 1, 0]];

describe("computeMisWeights: IS modes", () => {
  it("fixture: the 0.5 ratio is exact (the bounds are closed)", () => {
    expect(Math.exp(Math.log(0.5))).toBe(0.5);
  });

  it("token truncate: clamp(w, 0, U) * mask", () => {
    // [3, 1, 0.5, 5] -> [2, 1, 0.5, 0 (masked)]; truncate_fraction = 1[w > 2] = [1, 0, 0, 1]
    const out = computeMisWeights(OLD, ROL, MASK, BASE);
    close(out.weights?.[0], [2, 1, 0.5, 0]);
    expect(arr(out.modifiedMask[0])).toEqual([1, 1, 1, 0]);
    expect(arr(out.metrics.tis_truncate_fraction?.[0])).toEqual([1, 0, 0, 1]);
    close(out.metrics.tis_weight_before_bound?.[0], [3, 1, 0.5, 5]);
    // final stats over trained tokens: mean (2 + 1 + 0.5) / 3 = 7/6, min 0.5, max 2
    close(out.metrics.is_ratio_mean_final?.[0], [7 / 6, 7 / 6, 7 / 6, 7 / 6]);
    close(out.metrics.is_ratio_min_final?.[0], [0.5, 0.5, 0.5, 0.5]);
    close(out.metrics.is_ratio_max_final?.[0], [2, 2, 2, 2]);
  });

  it("token clip: clamp(w, L, U) * mask", () => {
    close(computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_mode: "clip" }).weights?.[0], [2, 1, 0.5, 0]);
    // L = 0.6: 0.5 -> 0.6
    close(computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_mode: "clip", tis_lower_bound: 0.6 }).weights?.[0], [2, 1, 0.6, 0]);
  });

  it("tis_lower_bound null falls back to 1/U", () => {
    // U = 4 -> L = 0.25: 0.5 stays; clip: [3, 1, 0.5, 0]
    close(computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_mode: "clip", tis_lower_bound: null, tis_upper_bound: 4 }).weights?.[0], [3, 1, 0.5, 0]);
  });

  it("token mask: keep the weight, reject out-of-range tokens from the mask", () => {
    // w = [3, 1, 0.5, 0]; in [0.5, 2] (closed): [0, 1, 1, 0] -> mask [0, 1, 1, 0]
    const out = computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_mode: "mask" });
    close(out.weights?.[0], [3, 1, 0.5, 0]);
    expect(arr(out.modifiedMask[0])).toEqual([0, 1, 1, 0]);
  });

  it("sequence level: exp(masked sum) on every token", () => {
    // ln 3 + 0 + ln 0.5 = ln 1.5 -> 1.5, masked token 0
    close(computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_level: "sequence" }).weights?.[0], [1.5, 1.5, 1.5, 0]);
  });

  it("geometric level: exp(masked mean) = 1.5^(1/3) = 1.1447142425533319", () => {
    const g = 1.1447142425533319;
    close(computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_level: "geometric" }).weights?.[0], [g, g, g, 0]);
  });

  it("clamps log-ratios to ±20 before exp", () => {
    // sequence sum 15 + 15 = 30 -> 20 -> e^20 = 485165195.4097903, then truncated to 2
    const out = computeMisWeights([[15, 15]], [[0, 0]], [[1, 1]], { ...BASE, tis_level: "sequence" });
    close(out.metrics.tis_weight_before_bound?.[0], [485165195.4097903, 485165195.4097903], 3);
    close(out.weights?.[0], [2, 2]);
  });
});

describe("computeMisWeights: rejection sampling and veto", () => {
  it("token RS with bounds defaulting to the tis bounds", () => {
    // rs ratios [3, 1, 0.5, 5] in [0.5, 2]: [0, 1, 1, 0] -> mask [0, 1, 1, 0]; weights still truncated
    const out = computeMisWeights(OLD, ROL, MASK, { ...BASE, use_rs: true });
    expect(arr(out.modifiedMask[0])).toEqual([0, 1, 1, 0]);
    close(out.weights?.[0], [2, 1, 0.5, 0]);
    expect(arr(out.metrics.rs_mask_fraction_high?.[0])).toEqual([1, 0, 0, 1]);
  });

  it("explicit RS bounds and a different RS level", () => {
    // rs_level sequence: 1.5 everywhere; bounds [0.5, 1.2] -> 1.5 rejected -> all 0
    const out = computeMisWeights(OLD, ROL, MASK, { ...BASE, use_rs: true, rs_level: "sequence", rs_upper_bound: 1.2 });
    expect(arr(out.modifiedMask[0])).toEqual([0, 0, 0, 0]);
    // token level with rs_upper_bound 4: [3, 1, 0.5] all in [0.5, 4]
    expect(arr(computeMisWeights(OLD, ROL, MASK, { ...BASE, use_rs: true, rs_upper_bound: 4 }).modifiedMask[0])).toEqual([1, 1, 1, 0]);
  });

  it("veto zeroes the whole sequence when a trained token's ratio < threshold", () => {
    // ratios [1e-5, 1]: 1e-5 < 1e-4 -> vetoed. RS bounds widened so only the veto acts.
    const opts: MisOptions = { ...BASE, use_rs: true, rs_lower_bound: 1e-9, rs_veto_threshold: 1e-4 };
    const vetoed = computeMisWeights([[Math.log(1e-5), 0]], [[0, 0]], [[1, 1]], opts);
    expect(arr(vetoed.modifiedMask[0])).toEqual([0, 0]);
    expect(arr(vetoed.metrics.rs_catastrophic_seq_fraction?.[0])).toEqual([1, 1]);
    // the same token with mask 0 does not veto
    const kept = computeMisWeights([[Math.log(1e-5), 0]], [[0, 0]], [[0, 1]], opts);
    expect(arr(kept.modifiedMask[0])).toEqual([0, 1]);
  });
});

describe("computeMisWeights: batch normalisation", () => {
  it("token level: divide by the mean over trained tokens", () => {
    // mean = (2 + 1 + 0.5) / 3 = 7/6 -> [12/7, 6/7, 3/7, 0]
    const out = computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_batch_normalize: true });
    close(out.weights?.[0], [12 / 7, 6 / 7, 3 / 7, 0]);
    close(out.metrics.batch_norm_factor?.[0], [7 / 6, 7 / 6, 7 / 6, 7 / 6]);
  });

  it("sequence level: divide by the mean of per-sequence means", () => {
    // A: 1.5; C: old - rol = ln 0.25 -> 0.25; mean (1.5 + 0.25) / 2 = 0.875
    // -> A: 1.5 / 0.875 = 1.7142857142857142, C: 0.25 / 0.875 = 0.2857142857142857
    const out = computeMisWeights([...OLD, [Math.log(0.25)]], [...ROL, [0]], [...MASK, [1]], {
      ...BASE,
      tis_level: "sequence",
      tis_batch_normalize: true,
    });
    close(out.weights?.[0], [1.7142857142857142, 1.7142857142857142, 1.7142857142857142, 0]);
    close(out.weights?.[1], [0.2857142857142857]);
  });

  it("geometric level refuses batch normalisation", () => {
    expect(() => computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_level: "geometric", tis_batch_normalize: true })).toThrow(/geometric/);
  });
});

describe("computeMisWeights: mismatch metrics only", () => {
  it("returns no weights and the masks unchanged, with the perplexity metrics", () => {
    // train [-1, -2], rollout [-1.5, -1.5]: means -1.5 / -1.5; kl = rollout - train = [-0.5, 0.5]
    // k3 with lr = [0.5, -0.5]: e^0.5 - 1.5 = 0.1487212707001282, e^-0.5 - 0.5 = 0.10653065971263342
    // chi2_token = (e + e^-1)/2 - 1 = 0.5430806348152437; chi2_seq = e^(2*0) - 1 = 0
    const out = computeMisWeights([[-1, -2]], [[-1.5, -1.5]], [[1, 1]], BASE, false);
    expect(out.weights).toBeNull();
    expect(arr(out.modifiedMask[0])).toEqual([1, 1]);
    close(out.metrics.training_log_ppl?.[0], [1.5, 1.5]);
    close(out.metrics.rollout_ppl?.[0], [Math.exp(1.5), Math.exp(1.5)]);
    close(out.metrics.kl?.[0], [-0.5, 0.5]);
    close(out.metrics.k3_kl?.[0], [0.1487212707001282, 0.10653065971263342]);
    close(out.metrics.chi2_token?.[0], [0.5430806348152437, 0.5430806348152437]);
    close(out.metrics.chi2_seq?.[0], [0, 0]);
    close(out.metrics.log_ppl_abs_diff?.[0], [0, 0]);
  });

  it("handles empty and fully masked samples", () => {
    const out = computeMisWeights([[], [0.3]], [[], [0]], [[], [0]], { ...BASE, use_rs: true, tis_batch_normalize: true });
    expect(out.weights?.[0]?.length).toBe(0);
    // fully masked: weight 0, min/max 0; batch mean 0 <= 1e-8 -> factor 1
    expect(arr(out.weights?.[1])).toEqual([0]);
    expect(arr(out.metrics.is_ratio_min_final?.[1])).toEqual([0]);
    expect(arr(out.metrics.batch_norm_factor?.[1])).toEqual([1]);
  });
});

describe("computeMisWeights: bound checks (slime asserts)", () => {
  it("refuses lower >= upper in clip / mask mode and for RS", () => {
    expect(() => computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_mode: "clip", tis_lower_bound: 2 })).toThrow(/tis_lower_bound/);
    expect(() => computeMisWeights(OLD, ROL, MASK, { ...BASE, use_rs: true, rs_lower_bound: 3 })).toThrow(/rs_lower_bound/);
    // truncate ignores the lower bound
    expect(() => computeMisWeights(OLD, ROL, MASK, { ...BASE, tis_lower_bound: 2 })).not.toThrow();
  });
});
