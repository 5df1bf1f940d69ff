/**
 * Train/inference mismatch correction: which log-probs play "old", and slime's two
 * built-in TIS functions (slime/backends/megatron_utils/loss.py:884-931). The MIS
 * family lives in mis.ts.
 *
 * Three policies: π_θ (current, `logp`), π_old (the trainer's recompute at the start
 * of the step, `old`) and π_rollout (the engine, `rol`). The PPO ratio handles
 * π_θ/π_old; TIS weighs each token by ρ = π_old/π_rollout = exp(old − rol), a
 * constant (computed from detached tensors).
 */

import { algorithmError, assertRaggedLike, at, row, type Ragged } from "./ragged.ts";
import { resolveOptions } from "./options.ts";

export interface OldLogProbSources {
  /** `[B][T_i]` current log-probs (the fallback "old": detached, so ratio = 1). */
  logProbs: Ragged;
  /** `[B][T_i]` trainer recompute at the start of the step. */
  oldLogProbs?: Ragged;
  /** `[B][T_i]` engine log-probs. */
  rolloutLogProbs?: Ragged;
}

/**
 * The "old" log-probs of the PPO ratio (slime `policy_loss_function`):
 * - `use_rollout_logprobs` (bypass mode): the rollout log-probs; the PPO ratio then
 *   is π_θ/π_rollout and does the importance sampling itself;
 * - else the recomputed `oldLogProbs`;
 * - else the current log-probs themselves, treated as constants (slime reuses the
 *   detached logp when nothing was recomputed: ratio = 1, gradient still −A).
 */
export function resolveOldLogProbs(src: OldLogProbSources, useRolloutLogprobs: boolean): Ragged {
  if (useRolloutLogprobs) {
    if (src.rolloutLogProbs === undefined) throw algorithmError("missingInput", "use_rollout_logprobs needs rolloutLogProbs");
    assertRaggedLike(src.rolloutLogProbs, src.logProbs, "rolloutLogProbs", "logProbs");
    return src.rolloutLogProbs;
  }
  if (src.oldLogProbs !== undefined) {
    assertRaggedLike(src.oldLogProbs, src.logProbs, "oldLogProbs", "logProbs");
    return src.oldLogProbs;
  }
  return src.logProbs;
}

/**
 * The π_old used in TIS's ρ: the recomputed old log-probs, else the (detached)
 * current log-probs. Never the rollout log-probs (`train_log_probs_for_tis`).
 */
export function tisTrainLogProbs(src: OldLogProbSources): Ragged {
  return src.oldLogProbs ?? src.logProbs;
}

export interface TisResult {
  /** `[B][T_i]` the factor pg_loss is multiplied by. */
  weights: Float64Array[];
  /** `[B][T_i]` ρ = exp(old − rol) (metric `tis`). */
  ratio: Float64Array[];
  /** `[B][T_i]` 1[weight ≠ ρ] (metric `tis_clipfrac`). */
  clipfrac: Float64Array[];
  /** `[B][T_i]` |ρ − 1| (metric `tis_abs`). */
  abs: Float64Array[];
}

function perToken(trainLogProbs: Ragged, rolloutLogProbs: Ragged, weightOf: (rho: number) => number): TisResult {
  assertRaggedLike(rolloutLogProbs, trainLogProbs, "rolloutLogProbs", "trainLogProbs");
  const out: TisResult = { weights: [], ratio: [], clipfrac: [], abs: [] };
  trainLogProbs.forEach((tr, i) => {
    const rol = row(rolloutLogProbs, i, "rolloutLogProbs");
    const n = tr.length;
    const w = new Float64Array(n);
    const rho = new Float64Array(n);
    const cf = new Float64Array(n);
    const ab = new Float64Array(n);
    for (let t = 0; t < n; t++) {
      const r = Math.exp(at(tr, t) - at(rol, t));
      const weight = weightOf(r);
      rho[t] = r;
      w[t] = weight;
      cf[t] = weight !== r ? 1 : 0;
      ab[t] = Math.abs(r - 1);
    }
    out.weights.push(w);
    out.ratio.push(rho);
    out.clipfrac.push(cf);
    out.abs.push(ab);
  });
  return out;
}

/** The TIS bounds, as slime names them; a key left out takes slime's default (tis_clip 2, tis_clip_low 0). */
export interface TisClipOptions {
  tis_clip?: number;
  tis_clip_low?: number;
}

/**
 * The bounds from either `(options)` or `(tisClip, tisClipLow)`, in slime's option
 * order (`--tis-clip` before `--tis-clip-low`). Before this order was fixed the
 * positional form was (low, high): a call still written that way gives
 * low > high and is refused, never silently swapped.
 */
function tisBounds(fn: string, clipOrOptions: number | TisClipOptions | undefined, low: number | undefined): { tisClip: number; tisClipLow: number } {
  const o = typeof clipOrOptions === "number" ? { tis_clip: clipOrOptions, ...(low !== undefined && { tis_clip_low: low }) } : clipOrOptions;
  const { tis_clip, tis_clip_low } = resolveOptions(fn, o, ["tis_clip", "tis_clip_low"]);
  if (tis_clip_low > tis_clip) {
    throw algorithmError(
      "badArgument",
      `${fn}: tis_clip_low (${tis_clip_low}) > tis_clip (${tis_clip}); the arguments are (trainLogProbs, rolloutLogProbs, tis_clip, tis_clip_low) or an options object {tis_clip, tis_clip_low}`,
    );
  }
  return { tisClip: tis_clip, tisClipLow: tis_clip_low };
}

/**
 * Vanilla TIS (`vanilla_tis_function`): `w_t = clamp(ρ_t, tis_clip_low, tis_clip)`
 * (defaults 0 and 2). Masks are unchanged.
 */
export function vanillaTis(trainLogProbs: Ragged, rolloutLogProbs: Ragged, options?: TisClipOptions): TisResult;
export function vanillaTis(trainLogProbs: Ragged, rolloutLogProbs: Ragged, tisClip: number, tisClipLow?: number): TisResult;
export function vanillaTis(trainLogProbs: Ragged, rolloutLogProbs: Ragged, clipOrOptions?: number | TisClipOptions, tisClipLow?: number): TisResult {
  const { tisClip, tisClipLow: low } = tisBounds("vanillaTis", clipOrOptions, tisClipLow);
  return perToken(trainLogProbs, rolloutLogProbs, (r) => Math.min(Math.max(r, low), tisClip));
}

/**
 * IcePop (`icepop_function`): `w_t = ρ_t` if `tis_clip_low ≤ ρ_t ≤ tis_clip`, else 0.
 * Masks are unchanged (the zeroed tokens still count in the denominators).
 */
export function icepop(trainLogProbs: Ragged, rolloutLogProbs: Ragged, options?: TisClipOptions): TisResult;
export function icepop(trainLogProbs: Ragged, rolloutLogProbs: Ragged, tisClip: number, tisClipLow?: number): TisResult;
export function icepop(trainLogProbs: Ragged, rolloutLogProbs: Ragged, clipOrOptions?: number | TisClipOptions, tisClipLow?: number): TisResult {
  const { tisClip, tisClipLow: low } = tisBounds("icepop", clipOrOptions, tisClipLow);
  return perToken(trainLogProbs, rolloutLogProbs, (r) => (r >= low && r <= tisClip ? r : 0));
}
