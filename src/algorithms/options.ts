/**
 * Algorithm options, named as slime names them (`args.<name>` in slime's Python,
 * i.e. the flag `--eps-clip-high` is `eps_clip_high`; the negative flags
 * `--disable-rewards-normalization` / `--disable-grpo-std-normalization` are their
 * `dest` names `rewards_normalization` / `grpo_std_normalization`). Defaults are
 * slime's (slime/utils/arguments.py), except where a comment says otherwise.
 *
 * `algorithmOptionsSchema` is a plain `z.object` so the run config can spread
 * `algorithmOptionsShape` into its own object; the cross-field checks live in
 * `refineAlgorithmOptions`, to attach with `.superRefine` (zod 4 forbids
 * `.extend` on a refined object).
 */

import { z } from "zod";
import { algorithmError } from "./ragged.ts";

export const advantageEstimatorSchema = z.enum(["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]);
export type AdvantageEstimator = z.infer<typeof advantageEstimatorSchema>;

export const klTypeSchema = z.enum(["k1", "k2", "k3", "low_var_kl"]);
export type KlType = z.infer<typeof klTypeSchema>;

/** Which off-policy correction `use_tis` applies. slime picks one by module path (see below). */
export const tisFunctionSchema = z.enum(["vanilla", "icepop", "mis"]);
export type TisFunction = z.infer<typeof tisFunctionSchema>;

export const misLevelSchema = z.enum(["token", "sequence", "geometric"]);
export type MisLevel = z.infer<typeof misLevelSchema>;
export const misModeSchema = z.enum(["truncate", "clip", "mask"]);
export type MisMode = z.infer<typeof misModeSchema>;

export const algorithmOptionsShape = {
  // advantages (computed once per rollout, over the whole batch)
  advantage_estimator: advantageEstimatorSchema.default("grpo"),
  /** slime `--disable-rewards-normalization` sets this false. Group mean-centring for grpo/gspo/cispo/rpp_baseline. */
  rewards_normalization: z.boolean().default(true),
  /** slime `--disable-grpo-std-normalization` sets this false (Dr.GRPO). Divide by the group std (grpo/gspo/cispo). */
  grpo_std_normalization: z.boolean().default(true),
  /** Dict rewards: the key to train on. null: rewards are scalars. */
  reward_key: z.string().min(1).nullable().default(null),
  /** Reward-shaping KL coefficient (in the token rewards of reinforce++ / ppo, and the rpp_baseline advantage). */
  kl_coef: z.number().default(0),
  gamma: z.number().min(0).max(1).default(1.0),
  lambd: z.number().min(0).max(1).default(1.0),
  normalize_advantages: z.boolean().default(false),
  use_opd: z.boolean().default(false),
  opd_kl_coef: z.number().default(1.0),

  // policy loss
  eps_clip: z.number().nonnegative().default(0.2),
  /** null: the same as eps_clip. */
  eps_clip_high: z.number().nonnegative().nullable().default(null),
  /** Dual-clip constant c (> 1). null: no dual clip. */
  eps_clip_c: z.number().nullable().default(null),
  value_clip: z.number().nonnegative().default(0.2),
  use_kl_loss: z.boolean().default(false),
  kl_loss_coef: z.number().default(0),
  kl_loss_type: klTypeSchema.default("k1"),
  /** Multiply the KL-loss estimate by exp(logp - old) (DeepSeek-V3.2). The ratio carries gradient. */
  use_unbiased_kl: z.boolean().default(false),
  entropy_coef: z.number().default(0),
  calculate_per_token_loss: z.boolean().default(false),
  use_opsm: z.boolean().default(false),
  opsm_delta: z.number().default(1e-4),

  // off-policy correction
  /** Bypass mode: rollout log-probs are used as `old` (no trainer recompute). */
  use_rollout_logprobs: z.boolean().default(false),
  use_tis: z.boolean().default(false),
  /** Report the mismatch metrics of `tis_function` without changing the loss. */
  get_mismatch_metrics: z.boolean().default(false),
  tis_clip: z.number().nonnegative().default(2.0),
  tis_clip_low: z.number().nonnegative().default(0),
  /**
   * rlq name. slime selects these with `--custom-tis-function-path`:
   * vanilla = `loss.vanilla_tis_function` (the default), icepop = `loss.icepop_function`,
   * mis = `examples/train_infer_mismatch_helper/mis.py:compute_mis_weights_with_cp`.
   */
  tis_function: tisFunctionSchema.default("vanilla"),
  // MIS (names and defaults from slime's examples/train_infer_mismatch_helper/mis.yaml)
  tis_level: misLevelSchema.default("token"),
  tis_mode: misModeSchema.default("truncate"),
  /** null: 1 / tis_upper_bound. */
  tis_lower_bound: z.number().nonnegative().nullable().default(0.5),
  tis_upper_bound: z.number().positive().default(2.0),
  use_rs: z.boolean().default(true),
  rs_level: misLevelSchema.default("token"),
  /** null: the (resolved) tis_lower_bound. */
  rs_lower_bound: z.number().nonnegative().nullable().default(null),
  /** null: tis_upper_bound. */
  rs_upper_bound: z.number().positive().nullable().default(null),
  /** Reject a whole sequence when any of its trained tokens has ratio < this. null: no veto. */
  rs_veto_threshold: z.number().positive().nullable().default(1e-4),
  tis_batch_normalize: z.boolean().default(true),
};

export const algorithmOptionsSchema = z.object(algorithmOptionsShape);
/** Options after defaults. */
export type AlgorithmOptions = z.infer<typeof algorithmOptionsSchema>;
/** Options as a caller may write them (every key optional). */
export type AlgorithmOptionsInput = z.input<typeof algorithmOptionsSchema>;

/** The cross-field rules slime asserts in `slime_validate_args`, plus MIS's own asserts. */
export function refineAlgorithmOptions(o: AlgorithmOptions, ctx: z.RefinementCtx): void {
  const issue = (path: string, message: string): void => {
    ctx.addIssue({ code: "custom", path: [path], message });
  };
  if (o.eps_clip_c !== null && !(o.eps_clip_c > 1)) {
    issue("eps_clip_c", `dual-clip constant must be > 1, got ${o.eps_clip_c}`);
  }
  if (o.kl_coef !== 0 && o.kl_loss_coef !== 0) {
    issue("kl_loss_coef", "only one of kl_coef and kl_loss_coef can be non-zero (slime)");
  }
  if ((o.advantage_estimator === "reinforce_plus_plus" || o.advantage_estimator === "reinforce_plus_plus_baseline") && !o.normalize_advantages) {
    issue("normalize_advantages", `${o.advantage_estimator} requires normalize_advantages: true (slime)`);
  }
  if (o.use_rollout_logprobs && o.use_tis) {
    issue("use_tis", "cannot be combined with use_rollout_logprobs (slime)");
  }
  if (o.tis_function === "mis") {
    const lower = resolvedMisBounds(o);
    if (o.tis_mode !== "truncate" && !(lower.tisLower < o.tis_upper_bound)) {
      issue("tis_lower_bound", `must be < tis_upper_bound (${o.tis_upper_bound}) in ${o.tis_mode} mode`);
    }
    if (o.use_rs && !(lower.rsLower < lower.rsUpper)) {
      issue("rs_lower_bound", `must be < rs_upper_bound (${lower.rsUpper})`);
    }
    if (o.tis_batch_normalize && o.tis_level === "geometric") {
      issue("tis_batch_normalize", "is not defined for tis_level geometric (slime raises)");
    }
  }
}

export const validatedAlgorithmOptionsSchema = algorithmOptionsSchema.superRefine(refineAlgorithmOptions);

/** Parses and validates; throws a ZodError naming the field. */
export function parseAlgorithmOptions(input: unknown): AlgorithmOptions {
  return validatedAlgorithmOptionsSchema.parse(input ?? {});
}

/** `eps_clip_high`, falling back to `eps_clip` as slime does after parsing. */
export function effectiveEpsClipHigh(o: Pick<AlgorithmOptions, "eps_clip" | "eps_clip_high">): number {
  return o.eps_clip_high ?? o.eps_clip;
}

export interface MisBounds {
  tisLower: number;
  tisUpper: number;
  rsLower: number;
  rsUpper: number;
}

/** MIS bound fallbacks, as `compute_mis_weights` resolves them. */
export function resolvedMisBounds(o: Pick<AlgorithmOptions, "tis_lower_bound" | "tis_upper_bound" | "rs_lower_bound" | "rs_upper_bound">): MisBounds {
  const tisLower = o.tis_lower_bound ?? 1 / o.tis_upper_bound;
  return {
    tisLower,
    tisUpper: o.tis_upper_bound,
    rsLower: o.rs_lower_bound ?? tisLower,
    rsUpper: o.rs_upper_bound ?? o.tis_upper_bound,
  };
}

/**
 * The options a public function reads, each validated and defaulted as the
 * run config does (slime's defaults), so a call from plain JS with a partial
 * or mistyped object gets a clear error or slime's default, never NaN.
 * Extra keys are ignored (a whole run config may be passed).
 */
export function resolveOptions<K extends keyof AlgorithmOptions>(fn: string, options: unknown, keys: readonly K[]): Pick<AlgorithmOptions, K> {
  if (options !== undefined && options !== null && (typeof options !== "object" || Array.isArray(options))) {
    throw algorithmError("badArgument", `${fn}: options must be an object of slime-named options (e.g. {eps_clip: 0.2}), got ${JSON.stringify(options)}`);
  }
  // A z.object of just the keys asked for (zod's .pick typing cannot follow a generic key list).
  const picked = z.object(Object.fromEntries(keys.map((k) => [k, algorithmOptionsShape[k]])));
  const parsed = picked.safeParse(options ?? {});
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const key = i.path.join(".");
      const value = (options as Record<string, unknown> | undefined)?.[key];
      return `${fn}: options.${key} = ${value === undefined ? "(missing)" : JSON.stringify(value)}: ${i.message}`;
    });
    throw algorithmError("badArgument", lines.join("\n"));
  }
  return parsed.data as unknown as Pick<AlgorithmOptions, K>;
}
