/**
 * TEST FAKE — the "model" behind the fake inference servers: a pure function
 * of (weight version, position, previous token) giving logits over 96 tokens
 * (printable bytes 32..126 and EOS 257, the byte tokenizer's ids). Sampling
 * follows a real server: temperature, then top-k / top-p truncation, then a
 * draw seeded by (sampling_seed, version, position, previous token), so the
 * same request on the same version gives the same tokens. The reported
 * log-prob depends on the server's log-prob mode, so rlq's probe can tell a
 * correctly configured server from a misconfigured one:
 *   scaled    log softmax(z / T)              (SGLang's default; what rlq needs)
 *   original  log softmax(z)                  (SGLANG_RETURN_ORIGINAL_LOGPROB, vLLM raw_logprobs)
 *   truncated log of the renormalised top-k/top-p distribution (vLLM processed_logprobs)
 */
export const EOS = 257;
export const VOCAB: readonly number[] = [...Array.from({ length: 95 }, (_, i) => 32 + i), EOS];
export type LogprobMode = "scaled" | "original" | "truncated";

export function mix(...xs: number[]): number {
  let h = 0x9e3779b9;
  for (const x of xs) {
    h ^= x >>> 0;
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
    h ^= h >>> 16;
  }
  return (h >>> 0) / 4294967296;
}

function logSumExp(xs: readonly number[]): number {
  let max = -Infinity;
  for (const x of xs) if (x > max) max = x;
  if (max === -Infinity) return -Infinity;
  let s = 0;
  for (const x of xs) s += Math.exp(x - max);
  return max + Math.log(s);
}

export interface SampleInput {
  seed: number;
  version: number;
  position: number;
  prev: number;
  temperature: number;
  topP: number;
  topK: number;
  /** Probability of EOS at temperature 1 (when EOS is allowed at this position). */
  stopProb: number;
  isEosAllowed: boolean;
  mode: LogprobMode;
  /** Also return the `topN` most likely tokens with their log-probs (in `mode`), most likely first. */
  topN?: number;
  /** A draw that ignores `seed` (a server that does not honour seeds): a uniform number in [0, 1). */
  unseeded?: number;
}

export function sampleToken(x: SampleInput): { token: number; logProb: number; top: Array<[number, number]> } {
  const others = VOCAB.length - 1;
  const z: number[] = new Array<number>(VOCAB.length);
  for (let j = 0; j < others; j++) z[j] = (mix(x.version, x.position, x.prev, j) - 0.5) * 6;
  const p = Math.min(Math.max(x.stopProb, 1e-6), 1 - 1e-6);
  z[others] = x.isEosAllowed ? Math.log(p / (1 - p)) + logSumExp(z.slice(0, others)) : -Infinity;
  const isGreedy = x.temperature <= 1e-6;
  const t = isGreedy ? 1 : x.temperature;
  const scaled = z.map((v) => v / t);
  const logZ = logSumExp(scaled);
  const lp = scaled.map((v) => v - logZ);
  // Truncation: order by probability, keep top-k, then the smallest prefix whose mass reaches top_p.
  const order = lp.map((_, i) => i).sort((a, b) => (lp[b] as number) - (lp[a] as number));
  const k = isGreedy ? 1 : x.topK > 0 ? Math.min(x.topK, order.length) : order.length;
  const kept: number[] = [];
  let mass = 0;
  for (const i of order.slice(0, k)) {
    if ((lp[i] as number) === -Infinity) break;
    kept.push(i);
    mass += Math.exp(lp[i] as number);
    if (mass >= x.topP) break;
  }
  const u = (x.unseeded ?? mix(x.seed, x.version, x.position, x.prev, 11)) * mass;
  let acc = 0;
  let pick = kept[kept.length - 1] as number;
  for (const i of kept) {
    acc += Math.exp(lp[i] as number);
    if (u < acc) {
      pick = i;
      break;
    }
  }
  const logZraw = logSumExp(z);
  const keptSet = new Set(kept);
  const reported = (i: number): number => {
    if (x.mode === "scaled") return lp[i] as number;
    if (x.mode === "original") return (z[i] as number) - logZraw;
    return keptSet.has(i) ? (lp[i] as number) - Math.log(mass) : -Infinity;
  };
  const top: Array<[number, number]> = [];
  for (const i of order.slice(0, x.topN ?? 0)) top.push([Math.min(0, reported(i)), VOCAB[i] as number]);
  return { token: VOCAB[pick] as number, logProb: Math.min(0, reported(pick)), top };
}

/**
 * The "instant" model (fake-sglang --model instant): the same determinism
 * (a pure function of seed, version, position and previous token) at a few
 * hash rounds per token instead of a softmax over the vocabulary, so that a
 * throughput bench measures rlq and not the fake. EOS with probability
 * stopProb where allowed, else a uniform printable byte; the log-prob is that
 * of the draw under this distribution. Temperature, top-k and top-p are
 * ignored (and the log-prob mode with them): benches only.
 */
export function instantToken(x: Pick<SampleInput, "seed" | "version" | "position" | "prev" | "stopProb" | "isEosAllowed">): { token: number; logProb: number } {
  const u = mix(x.seed, x.version, x.position, x.prev);
  const others = VOCAB.length - 1;
  const pStop = x.isEosAllowed ? Math.min(Math.max(x.stopProb, 0), 1) : 0;
  if (u < pStop) return { token: EOS, logProb: Math.log(pStop) };
  const pick = Math.min(others - 1, Math.floor(((u - pStop) / (1 - pStop)) * others));
  return { token: VOCAB[pick] as number, logProb: Math.log((1 - pStop) / others) };
}

/**
 * The log-prob at temperature 1 of a GIVEN token at `position` after `prev` (the prefill of an input
 * token, SGLang's input_token_logprobs): the same logits as `sampleToken`, EOS allowed. A token outside
 * the fake's 96-token vocabulary (a byte tokenizer's control bytes in a prompt) gets -30, the finite
 * floor a real model gives its least likely tokens.
 */
export const OUT_OF_VOCAB_LOGPROB = -30;
export function inputTokenLogProb(x: { version: number; position: number; prev: number; token: number; stopProb: number }): number {
  const d = sampleToken({ ...x, seed: 0, temperature: 1, topP: 1, topK: -1, isEosAllowed: true, mode: "scaled", topN: VOCAB.length });
  const hit = d.top.find(([, t]) => t === x.token);
  return hit === undefined ? OUT_OF_VOCAB_LOGPROB : hit[0];
}
