/**
 * Backward recurrences over one sample's response tokens.
 *
 * slime computes these with a chunked parallel scan (`chunked_discounted_returns`,
 * `chunked_gae`, slime/utils/ppo_utils.py:606-715), which is mathematically the
 * serial recurrence below; its own tests pin the two as equal. rlq runs the serial
 * form in float64.
 */

import { assertFiniteArgument, assertLength, at, type Vec } from "./ragged.ts";

/**
 * `G_t = r_t + γ · G_{t+1}`, `G_T = 0`.
 *
 * @param tokenRewards `[T]`
 * @returns `[T]`
 */
export function discountedReturns(tokenRewards: Vec, gamma: number): Float64Array {
  assertFiniteArgument("discountedReturns", "gamma", gamma);
  const out = new Float64Array(tokenRewards.length);
  let running = 0;
  for (let t = tokenRewards.length - 1; t >= 0; t--) {
    running = at(tokenRewards, t) + gamma * running;
    out[t] = running;
  }
  return out;
}

/**
 * Generalised advantage estimation (`vanilla_gae`):
 * `δ_t = r_t + γ V_{t+1} − V_t` with `V_T = 0`, `A_t = δ_t + γλ A_{t+1}`,
 * returns `R_t = A_t + V_t`.
 *
 * @param tokenRewards `[T]`
 * @param values `[T]` critic values at each response token.
 */
export function gae(tokenRewards: Vec, values: Vec, gamma: number, lambd: number): { advantages: Float64Array; returns: Float64Array } {
  assertFiniteArgument("gae", "gamma", gamma);
  assertFiniteArgument("gae", "lambd", lambd);
  assertLength(values, tokenRewards.length, "values");
  const n = tokenRewards.length;
  const advantages = new Float64Array(n);
  const returns = new Float64Array(n);
  let last = 0;
  for (let t = n - 1; t >= 0; t--) {
    const nextValue = t < n - 1 ? at(values, t + 1) : 0;
    const delta = at(tokenRewards, t) + gamma * nextValue - at(values, t);
    last = delta + gamma * lambd * last;
    advantages[t] = last;
    returns[t] = last + at(values, t);
  }
  return { advantages, returns };
}
