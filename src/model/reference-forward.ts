/**
 * The test oracle: a plain float64 forward pass of the model, written for
 * clarity, not speed (O(T^2 d) per layer with scalar loops). Engine (ONNX,
 * float32) and trainer (jax-js, float32) are both checked against it, so it
 * must stay an independent implementation: do not share code with them.
 */

import { headDim, type ModelConfig } from "./config.ts";
import { tensor, type Weights } from "./weights.ts";
import { RlqError } from "../lib/errors.ts";

const GELU_C = Math.sqrt(2 / Math.PI);

function layerNorm(x: Float64Array, g: Float32Array, b: Float32Array, eps: number): Float64Array {
  const n = x.length;
  let mean = 0;
  for (let i = 0; i < n; i++) mean += x[i]!;
  mean /= n;
  let variance = 0;
  for (let i = 0; i < n; i++) variance += (x[i]! - mean) ** 2;
  variance /= n;
  const inv = 1 / Math.sqrt(variance + eps);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = (x[i]! - mean) * inv * g[i]! + b[i]!;
  return out;
}

/** y = x @ W + b with W stored [in, out]. */
function linear(x: Float64Array, w: Float32Array, b: Float32Array | null, outDim: number): Float64Array {
  const out = new Float64Array(outDim);
  for (let o = 0; o < outDim; o++) out[o] = b ? b[o]! : 0;
  for (let i = 0; i < x.length; i++) {
    const xi = x[i]!;
    const row = i * outDim;
    for (let o = 0; o < outDim; o++) out[o]! += xi * w[row + o]!;
  }
  return out;
}

/**
 * Logits for every position of one sequence.
 * @param tokens [T] token ids, T <= context_length
 * @returns [T, vocab] float64, row t = logits predicting token t+1
 */
export function referenceForward(config: ModelConfig, weights: Weights, tokens: readonly number[]): Float64Array[] {
  const { d_model: d, n_heads: nh, vocab_size: v, layer_norm_eps: eps } = config;
  const hd = headDim(config);
  const T = tokens.length;
  if (T > config.context_length) throw new RlqError("invariant_violated", `referenceForward: ${T} tokens exceed context ${config.context_length}`);
  const tok = tensor(weights, "tok_emb.weight");
  const pos = tensor(weights, "pos_emb.weight");
  let xs: Float64Array[] = tokens.map((id, t) => {
    const x = new Float64Array(d);
    for (let i = 0; i < d; i++) x[i] = tok[id * d + i]! + pos[t * d + i]!;
    return x;
  });
  for (let l = 0; l < config.n_layers; l++) {
    const w = (n: string): Float32Array => tensor(weights, `blocks.${l}.${n}`);
    const qkv = xs.map((x) => linear(layerNorm(x, w("ln1.weight"), w("ln1.bias"), eps), w("attn.qkv.weight"), w("attn.qkv.bias"), 3 * d));
    const attnOut = xs.map(() => new Float64Array(d));
    for (let h = 0; h < nh; h++) {
      for (let t = 0; t < T; t++) {
        const q = qkv[t]!;
        const scores = new Float64Array(t + 1);
        let max = -Infinity;
        for (let s = 0; s <= t; s++) {
          let dot = 0;
          for (let j = 0; j < hd; j++) dot += q[h * hd + j]! * qkv[s]![d + h * hd + j]!;
          scores[s] = dot / Math.sqrt(hd);
          max = Math.max(max, scores[s]!);
        }
        let z = 0;
        for (let s = 0; s <= t; s++) z += scores[s] = Math.exp(scores[s]! - max);
        for (let s = 0; s <= t; s++) {
          const p = scores[s]! / z;
          for (let j = 0; j < hd; j++) attnOut[t]![h * hd + j]! += p * qkv[s]![2 * d + h * hd + j]!;
        }
      }
    }
    xs = xs.map((x, t) => {
      const proj = linear(attnOut[t]!, w("attn.proj.weight"), w("attn.proj.bias"), d);
      const r = x.map((xi, i) => xi + proj[i]!);
      const hidden = linear(layerNorm(r, w("ln2.weight"), w("ln2.bias"), eps), w("mlp.fc.weight"), w("mlp.fc.bias"), config.d_mlp);
      for (let i = 0; i < hidden.length; i++) {
        const u = hidden[i]!;
        hidden[i] = 0.5 * u * (1 + Math.tanh(GELU_C * (u + 0.044715 * u * u * u)));
      }
      const mlp = linear(hidden, w("mlp.proj.weight"), w("mlp.proj.bias"), d);
      return r.map((ri, i) => ri + mlp[i]!);
    });
  }
  return xs.map((x) => linear(layerNorm(x, tensor(weights, "ln_f.weight"), tensor(weights, "ln_f.bias"), eps), tensor(weights, "head.weight"), null, v));
}

/** log softmax(logits / temperature) over the full vocabulary, in float64. */
export function logSoftmax(logits: ArrayLike<number>, temperature = 1): Float64Array {
  const n = logits.length;
  const out = new Float64Array(n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, logits[i]! / temperature);
  let z = 0;
  for (let i = 0; i < n; i++) z += Math.exp(logits[i]! / temperature - max);
  const lse = max + Math.log(z);
  for (let i = 0; i < n; i++) out[i] = logits[i]! / temperature - lse;
  return out;
}

/**
 * Per-token log-probs of the response tokens: entry t is log p(tokens[promptLength + t] | prefix),
 * with logits divided by `temperature` (what the engine reports and the trainer recomputes).
 */
export function referenceResponseLogProbs(
  config: ModelConfig,
  weights: Weights,
  tokens: readonly number[],
  promptLength: number,
  temperature = 1,
): Float64Array {
  const logits = referenceForward(config, weights, tokens);
  const out = new Float64Array(tokens.length - promptLength);
  for (let t = promptLength; t < tokens.length; t++) {
    out[t - promptLength] = logSoftmax(logits[t - 1]!, temperature)[tokens[t]!]!;
  }
  return out;
}
