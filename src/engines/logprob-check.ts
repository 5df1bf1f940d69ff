/**
 * rlq needs each token's log-prob under log softmax(logits / T) over the full
 * vocabulary, before top-p/top-k truncation (docs/algorithms.md): that is what the
 * trainer recomputes. Servers can be configured otherwise, and not always
 * visibly: SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB environment variable
 * (log-probs before temperature) is not reported by any endpoint; vLLM's
 * --logprobs-mode is reported only in dev mode. So rlq asks the server itself:
 *
 *   probe A: greedy (top_k = 1) at temperature 1,   8 tokens
 *   probe B: greedy (top_k = 1) at temperature 0.5, same input
 *
 * Both pick the argmax token, so positions line up until the first
 * difference. For the argmax token, log p_T = -log Σ_j exp((z_j - z_max) / T)
 * strictly increases as T falls, unless the distribution is one-hot.
 * - B > A at informative positions → log-probs are temperature-scaled.
 *   B ≈ A everywhere → they are not (the raw distribution).
 * - A exactly 0 at every position → log-probs come after the top-k = 1
 *   truncation (renormalised to a single token). Any A < 0 → before it.
 * Positions where A ≈ 0 (a near-certain token) carry no information.
 */

import type { SamplingParams } from "./engine.ts";
import { RlqError } from "../lib/errors.ts";

export interface LogprobProbe {
  /** null: the probe could not tell (every position near-certain, or noisy). */
  isTemperatureScaled: boolean | null;
  isBeforeTruncation: boolean | null;
  detail: string;
}

const INFORMATIVE = -1e-3;
const SAME = 1e-4;
const EXACT_ZERO = -1e-7;

export interface ProbeRun {
  tokenIds: readonly number[];
  logProbs: readonly number[];
}

export function classifyProbe(atT1: ProbeRun, atTHalf: ProbeRun): LogprobProbe {
  let n = Math.min(atT1.tokenIds.length, atTHalf.tokenIds.length);
  for (let i = 0; i < n; i++) {
    if (atT1.tokenIds[i] !== atTHalf.tokenIds[i]) {
      n = i;
      break;
    }
  }
  const a = [...atT1.logProbs];
  const isBeforeTruncation = a.length === 0 ? null : a.some((x) => x < INFORMATIVE) ? true : a.every((x) => x >= EXACT_ZERO) ? false : null;
  let sharper = 0;
  let same = 0;
  let informative = 0;
  for (let i = 0; i < n; i++) {
    const x = atT1.logProbs[i] as number;
    const y = atTHalf.logProbs[i] as number;
    if (x >= INFORMATIVE) continue;
    informative++;
    if (y > x + SAME) sharper++;
    else if (Math.abs(y - x) <= SAME) same++;
  }
  const isTemperatureScaled = informative === 0 ? null : sharper === informative ? true : same === informative ? false : null;
  return {
    isTemperatureScaled,
    isBeforeTruncation,
    detail: `${informative} informative position(s) of ${n}; T=1 log-probs [${a
      .slice(0, 8)
      .map((x) => x.toFixed(4))
      .join(", ")}], T=0.5 [${atTHalf.logProbs
      .slice(0, 8)
      .map((x) => x.toFixed(4))
      .join(", ")}]`,
  };
}

export interface TopLogprob {
  tokenId: number;
  logProb: number;
}

/**
 * The SGLang probe, on the sampling path (top_k -1, one token, the top-2
 * log-probs of the first position): SGLang computes log-probs on the greedy
 * path (every request of the batch with top_k <= 1) as log_softmax(logits)
 * WITHOUT temperature (layers/sampler.py), so a greedy probe reads the same at
 * every temperature and would call a correct server "unscaled". The argmax
 * token is the same at every temperature, so its log-prob is compared:
 *
 *   a: T = 1,   top_k -1      b: T = 0.5, top_k -1      c: T = 1, top_k 2
 *
 * - b > a → scaled by temperature; b ≈ a → not.
 * - c ≈ a → before top-k truncation; c > a → after it (renormalised over 2).
 * An argmax near-certain at T = 1 (a ≈ 0) tells nothing: inconclusive.
 */
export function classifySamplingProbe(a: readonly TopLogprob[], b: readonly TopLogprob[], c: readonly TopLogprob[]): LogprobProbe {
  const x = a[0];
  const detail = `top-1 log-prob at T=1 ${x?.logProb.toFixed(4) ?? "?"}, at T=0.5 ${b[0]?.logProb.toFixed(4) ?? "?"}, at T=1 top_k 2 ${c[0]?.logProb.toFixed(4) ?? "?"}`;
  if (x === undefined || x.logProb >= INFORMATIVE) return { isTemperatureScaled: null, isBeforeTruncation: null, detail: `inconclusive: ${detail}` };
  const y = b.find((t) => t.tokenId === x.tokenId);
  const z = c.find((t) => t.tokenId === x.tokenId);
  const isTemperatureScaled = y === undefined ? null : y.logProb > x.logProb + SAME ? true : Math.abs(y.logProb - x.logProb) <= SAME ? false : null;
  const isBeforeTruncation = z === undefined ? null : Math.abs(z.logProb - x.logProb) <= SAME ? true : z.logProb > x.logProb + SAME ? false : null;
  return { isTemperatureScaled, isBeforeTruncation, detail };
}

/**
 * Refuse a request whose sampling would make the server's log-probs differ
 * from what the trainer recomputes. Unscaled log-probs are exact at T = 1;
 * truncated ones are exact with top_p = 1 and top_k disabled. An inconclusive
 * probe (null) is allowed; the pool logs it once.
 */
export function checkLogprobCompatibility(probe: LogprobProbe, sampling: Pick<SamplingParams, "temperature" | "topP" | "topK">, engineId: string): void {
  const isTruncating = sampling.topP < 1 || sampling.topK > 0;
  if (probe.isTemperatureScaled === false && sampling.temperature !== 1) {
    throw new RlqError(
      "engine_logprobs_unscaled",
      `engine ${engineId} reports log-probs before temperature scaling, but rollout_temperature = ${sampling.temperature}; rlq needs log softmax(logits / T). ` +
        `For SGLang unset SGLANG_RETURN_ORIGINAL_LOGPROB; for vLLM use --logprobs-mode processed_logprobs with top_p = 1 and top_k = -1 (probe: ${probe.detail})`,
      { isRetriable: false },
    );
  }
  if (probe.isBeforeTruncation === false && isTruncating) {
    throw new RlqError(
      "engine_logprobs_truncated",
      `engine ${engineId} reports log-probs after top-p/top-k truncation, but rollout_top_p = ${sampling.topP}, rollout_top_k = ${sampling.topK}; rlq needs them before truncation. ` +
        `For vLLM use --logprobs-mode raw_logprobs with rollout_temperature = 1 (probe: ${probe.detail})`,
      { isRetriable: false },
    );
  }
}
