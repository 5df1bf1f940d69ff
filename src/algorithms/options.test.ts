import { describe, expect, it } from "vitest";
import { z } from "zod";
import { algorithmOptionsSchema, effectiveEpsClipHigh, parseAlgorithmOptions, refineAlgorithmOptions, resolvedMisBounds } from "./options.ts";

function issues(input: unknown): string[] {
  try {
    parseAlgorithmOptions(input);
    return [];
  } catch (error) {
    if (!(error instanceof z.ZodError)) throw error;
    return error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
  }
}

describe("algorithm options", () => {
  it("defaults are slime's", () => {
    const o = parseAlgorithmOptions({});
    expect(o).toMatchObject({
      advantage_estimator: "grpo",
      eps_clip: 0.2,
      eps_clip_high: null,
      eps_clip_c: null,
      kl_loss_type: "k1",
      kl_loss_coef: 0,
      kl_coef: 0,
      entropy_coef: 0,
      gamma: 1,
      lambd: 1,
      tis_clip: 2,
      tis_clip_low: 0,
      opsm_delta: 1e-4,
      calculate_per_token_loss: false,
      rewards_normalization: true,
      grpo_std_normalization: true,
    });
    expect(effectiveEpsClipHigh(o)).toBe(0.2);
    expect(effectiveEpsClipHigh({ eps_clip: 0.2, eps_clip_high: 0.28 })).toBe(0.28);
  });

  it("enforces slime's cross-field rules, naming the field", () => {
    expect(issues({ eps_clip_c: 1 })).toEqual([expect.stringMatching(/^eps_clip_c: .*> 1/)]);
    expect(issues({ kl_coef: 0.1, kl_loss_coef: 0.1 })).toEqual([expect.stringMatching(/^kl_loss_coef:/)]);
    expect(issues({ advantage_estimator: "reinforce_plus_plus" })).toEqual([expect.stringMatching(/^normalize_advantages:/)]);
    expect(issues({ advantage_estimator: "reinforce_plus_plus", normalize_advantages: true })).toEqual([]);
    expect(issues({ use_tis: true, use_rollout_logprobs: true })).toEqual([expect.stringMatching(/^use_tis:/)]);
    expect(issues({ tis_function: "mis", tis_level: "geometric" })).toEqual([expect.stringMatching(/^tis_batch_normalize:/)]);
    expect(issues({ tis_function: "mis", tis_mode: "clip", tis_lower_bound: 3, use_rs: false })).toEqual([expect.stringMatching(/^tis_lower_bound:/)]);
    expect(issues({ advantage_estimator: "dapo" })).toEqual([expect.stringMatching(/^advantage_estimator:/)]);
  });

  it("the plain schema can be spread into a larger config and refined there", () => {
    const runConfig = z.object({ ...algorithmOptionsSchema.shape, lr: z.number() }).superRefine(refineAlgorithmOptions);
    expect(runConfig.safeParse({ lr: 1e-6, eps_clip_c: 0.5 }).success).toBe(false);
    expect(runConfig.parse({ lr: 1e-6 }).eps_clip).toBe(0.2);
  });

  it("MIS bounds fall back as compute_mis_weights does", () => {
    // L = 1/U when null; RS bounds default to the resolved tis bounds
    expect(resolvedMisBounds({ tis_lower_bound: null, tis_upper_bound: 4, rs_lower_bound: null, rs_upper_bound: null })).toEqual({
      tisLower: 0.25,
      tisUpper: 4,
      rsLower: 0.25,
      rsUpper: 4,
    });
  });
});
