/**
 * The one module that imports the autodiff library (@jax-js/jax, wasm backend).
 * Everything else in the trainer sees plain Float32Arrays: swapping the library
 * means rewriting this file only.
 *
 * Why jax-js: a jit-compiled fwd+bwd of this network runs ~6x faster than
 * tfjs-wasm on this box (see docs/embedded-model.md), and jit + grad make the
 * code a direct transcription of the forward pass. Its wasm backend runs
 * single-threaded in Node (no Web Worker global), which also makes results
 * bit-reproducible run to run.
 *
 * Memory: jax-js arrays are reference-counted and every op CONSUMES its inputs;
 * `.ref` takes an extra reference. Each weight is used exactly once below; the
 * residual stream `x` is used twice per sub-block, hence `x.ref`.
 */

import { defaultDevice, init, jit, nn, numpy as np, valueAndGrad } from "@jax-js/jax";
import { headDim, type ModelConfig } from "../../model/config.ts";
import { parameterSpecs, type Weights } from "../../model/weights.ts";

type Params = Record<string, np.Array>;

/** A padded batch: row b predicts targets[b, t] from inputIds[b, 0..t]. */
export interface PackedBatch {
  /** [B, T] int32 */
  inputIds: Int32Array;
  /** [B, T] int32 (0 where padded; those positions get zero coefficients) */
  targets: Int32Array;
  batch: number;
  seqLen: number;
}

export interface ForwardOutput {
  /** [B, T] log softmax(logits / temperature)[target] */
  logProbs: Float32Array;
  /** [B, T] entropy of softmax(logits / temperature) */
  entropy: Float32Array;
}

export interface JaxModel {
  forward(weights: Weights, batch: PackedBatch, temperature: number): ForwardOutput;
  /**
   * Gradient of the surrogate  J = Σ coefLogProb ⊙ logProb + Σ coefEntropy ⊙ entropy
   * w.r.t. every weight. With coefLogProb = dLoss/dlogp this is dLoss/dθ (chain rule
   * through the per-token log-probs), which keeps the loss math outside this module.
   */
  gradient(
    weights: Weights,
    batch: PackedBatch,
    coefLogProb: Float32Array,
    coefEntropy: Float32Array,
    temperature: number,
  ): { grads: Weights; surrogate: number };
}

let initialized: Promise<void> | null = null;

/** Initialise jax-js's wasm backend once per thread. */
export async function createJaxModel(config: ModelConfig): Promise<JaxModel> {
  initialized ??= init("wasm").then(() => {
    defaultDevice("wasm");
  });
  await initialized;
  const specs = parameterSpecs(config);
  const { vocab_size: vocab, d_model: d, n_heads: nh, layer_norm_eps: eps } = config;
  const hd = headDim(config);

  const layerNorm = (x: np.Array, g: np.Array, b: np.Array): np.Array => {
    const mean = x.ref.mean(-1, { keepdims: true });
    const centered = x.sub(mean);
    const variance = centered.ref.mul(centered.ref).mean(-1, { keepdims: true });
    return centered
      .div(np.sqrt(variance.add(eps)))
      .mul(g)
      .add(b);
  };

  /** [B,T] ids → per-token (logProb, entropy) [B,T] each. */
  const tokenStats = (p: Params, ids: np.Array, targets: np.Array, temperature: np.Array): [np.Array, np.Array] => {
    const [batch, seqLen] = ids.shape as [number, number];
    const w = (name: string): np.Array => p[name] as np.Array;
    // Embedding lookup as one-hot @ table: jax-js cannot jit the scatter that a gather's gradient needs.
    let x = np.matmul(nn.oneHot(ids, vocab).astype(np.float32), w("tok_emb.weight")).add(w("pos_emb.weight").slice([0, seqLen])); // [B,T,D]
    const causal = np.tri(seqLen, seqLen, 0).astype(np.bool); // [T,T]
    for (let l = 0; l < config.n_layers; l++) {
      const q = (n: string): np.Array => w(`blocks.${l}.${n}`);
      const qkv = np
        .matmul(layerNorm(x.ref, q("ln1.weight"), q("ln1.bias")), q("attn.qkv.weight"))
        .add(q("attn.qkv.bias"))
        .reshape([batch, seqLen, 3, nh, hd]);
      const query = qkv.ref.slice([], [], 0).transpose([0, 2, 1, 3]); // [B,H,T,hd]
      const keyT = qkv.ref.slice([], [], 1).transpose([0, 2, 3, 1]); // [B,H,hd,T]
      const value = qkv.slice([], [], 2).transpose([0, 2, 1, 3]); // [B,H,T,hd]
      const scores = np.where(causal.ref, np.matmul(query, keyT).mul(1 / Math.sqrt(hd)), -1e9); // [B,H,T,T]
      const heads = np.matmul(nn.softmax(scores, -1), value).transpose([0, 2, 1, 3]).reshape([batch, seqLen, d]);
      x = x.ref.add(np.matmul(heads, q("attn.proj.weight")).add(q("attn.proj.bias")));
      const hidden = nn.gelu(np.matmul(layerNorm(x.ref, q("ln2.weight"), q("ln2.bias")), q("mlp.fc.weight")).add(q("mlp.fc.bias")), { approximate: true });
      x = x.add(np.matmul(hidden, q("mlp.proj.weight")).add(q("mlp.proj.bias")));
    }
    causal.dispose();
    const logits = np.matmul(layerNorm(x, w("ln_f.weight"), w("ln_f.bias")), w("head.weight")).div(temperature); // [B,T,V]
    const logp = nn.logSoftmax(logits, -1);
    const tokenLogp = logp.ref.mul(nn.oneHot(targets, vocab).astype(np.float32)).sum(-1); // [B,T]
    const entropy = np.exp(logp.ref).mul(logp).sum(-1).neg(); // [B,T]
    return [tokenLogp, entropy];
  };

  const forwardJit = jit((p: Params, ids: np.Array, targets: np.Array, temperature: np.Array) => tokenStats(p, ids, targets, temperature));
  const surrogate = (p: Params, ids: np.Array, targets: np.Array, cLogp: np.Array, cEnt: np.Array, temperature: np.Array): np.Array => {
    const [logp, ent] = tokenStats(p, ids, targets, temperature);
    return logp.mul(cLogp).sum().add(ent.mul(cEnt).sum());
  };
  const gradJit = jit((p: Params, ids: np.Array, targets: np.Array, cLogp: np.Array, cEnt: np.Array, temperature: np.Array) =>
    valueAndGrad(surrogate)(p, ids, targets, cLogp, cEnt, temperature),
  );

  const toParams = (weights: Weights): Params => {
    const p: Params = {};
    for (const s of specs) p[s.name] = np.array(weights[s.name]!).reshape(s.shape);
    return p;
  };
  const inputs = (b: PackedBatch): [np.Array, np.Array] => [
    np.array(b.inputIds, { dtype: np.int32 }).reshape([b.batch, b.seqLen]),
    np.array(b.targets, { dtype: np.int32 }).reshape([b.batch, b.seqLen]),
  ];
  const scalar = (v: number): np.Array => np.array(new Float32Array([v]));

  return {
    forward(weights, batch, temperature) {
      const [ids, targets] = inputs(batch);
      const [logp, ent] = forwardJit(toParams(weights), ids, targets, scalar(temperature));
      return { logProbs: logp.dataSync() as Float32Array, entropy: ent.dataSync() as Float32Array };
    },
    gradient(weights, batch, coefLogProb, coefEntropy, temperature) {
      const [ids, targets] = inputs(batch);
      const shape = [batch.batch, batch.seqLen];
      const [value, grads] = gradJit(
        toParams(weights),
        ids,
        targets,
        np.array(coefLogProb).reshape(shape),
        np.array(coefEntropy).reshape(shape),
        scalar(temperature),
      );
      const out: Weights = {};
      for (const s of specs) out[s.name] = (grads[s.name] as np.Array).dataSync() as Float32Array;
      return { grads: out, surrogate: value.item() };
    },
  };
}
