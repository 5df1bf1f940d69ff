/**
 * The two ONNX sessions (prefill, decode) of one model config, and the weight
 * feeds of the current version. Weight tensors are wrapped once per version
 * (re-wrapping them every call costs more than the call's own overhead). No state beyond that:
 * the KV cache belongs to the caller.
 */

import { headDim, type ModelConfig } from "../../model/config.ts";
import { assertWeightsMatch, parameterSpecs, type Weights } from "../../model/weights.ts";
import { createOrtSession, floatTensor, int32Tensor, tensorFloats, type OrtFeeds, type OrtSession } from "../onnx-runtime.ts";
import { buildDecodeModel, buildPrefillModel } from "./graph-builder.ts";
import { RlqError } from "../../lib/errors.ts";

export interface PrefillOutput {
  /** [B, T, V] */
  logits: Float32Array;
  /** Per layer: [B, H, T, hd] keys then values, index 2l = key, 2l+1 = value. */
  present: Float32Array[];
}

export interface DecodeOutput {
  /** [B, V] */
  logits: Float32Array;
  /** Per layer: [B, H, 1, hd], index 2l = key, 2l+1 = value. */
  fresh: Float32Array[];
}

/**
 * A decode at a fixed row count over fixed past buffers, with its feeds built
 * once: write `ids` and `positions` in place, then `run()`. Building the feed
 * object (~30 weight tensors, the past views) on every tick was a visible share
 * of a small model's tick (bench/embedded-model.ts). Valid until the weights change.
 */
export interface DecodeHandle {
  /** [rows] int32, the token at `positions` (the tensors wrap these arrays). */
  readonly ids: Int32Array;
  /** [rows] int32, each < cacheLength */
  readonly positions: Int32Array;
  run(): Promise<DecodeOutput>;
}

export class ModelRunner {
  private weightFeeds: OrtFeeds = {};
  /** Bumped by setWeights: a DecodeHandle of another generation is stale. */
  private weightsGeneration = 0;

  private constructor(
    readonly config: ModelConfig,
    private readonly prefillSession: OrtSession,
    private readonly decodeSession: OrtSession,
  ) {}

  static async create(config: ModelConfig, weights: Weights, opts: { intraOpNumThreads?: number } = {}): Promise<ModelRunner> {
    const prefill = await createOrtSession(buildPrefillModel(config), opts);
    const decode = await createOrtSession(buildDecodeModel(config), opts);
    const runner = new ModelRunner(config, prefill, decode);
    runner.setWeights(weights);
    return runner;
  }

  /** Swap to another weight version (same config). The arrays must not change while in use. */
  setWeights(weights: Weights): void {
    assertWeightsMatch(this.config, weights);
    const feeds: OrtFeeds = {};
    for (const spec of parameterSpecs(this.config)) feeds[spec.name] = floatTensor(weights[spec.name] as Float32Array, spec.shape);
    this.weightFeeds = feeds;
    this.weightsGeneration++;
  }

  /** @param ids [B, T] int32 row-major, all rows starting at position 0 */
  async prefill(ids: Int32Array, batch: number, seqLen: number): Promise<PrefillOutput> {
    if (ids.length !== batch * seqLen) throw new RlqError("invariant_violated", `prefill: ${ids.length} ids for [${batch}, ${seqLen}]`);
    if (seqLen > this.config.context_length) throw new RlqError("invariant_violated", `prefill: ${seqLen} tokens exceed context ${this.config.context_length}`);
    const out = await this.prefillSession.run({ ...this.weightFeeds, input_ids: int32Tensor(ids, [batch, seqLen]) });
    const present: Float32Array[] = [];
    for (let l = 0; l < this.config.n_layers; l++) {
      present.push(tensorFloats(out[`present.${l}.key`], "key"), tensorFloats(out[`present.${l}.value`], "value"));
    }
    return { logits: tensorFloats(out.logits, "logits"), present };
  }

  /**
   * @param ids [B] int32, the token at `positions`
   * @param positions [B] int32, each < cacheLength
   * @param past per layer key/value [B, H, cacheLength, hd] (index 2l, 2l+1)
   */
  async decode(ids: Int32Array, positions: Int32Array, past: Float32Array[], cacheLength: number): Promise<DecodeOutput> {
    return this.runDecode(this.decodeFeeds(ids, positions, past, cacheLength));
  }

  /**
   * @param past per layer key/value [rows, H, cacheLength, hd] (index 2l, 2l+1); must stay
   *   the same arrays, unchanged in length, for the handle's life (the KV cache's slot views).
   */
  decodeHandle(rows: number, past: Float32Array[], cacheLength: number): DecodeHandle {
    const ids = new Int32Array(rows);
    const positions = new Int32Array(rows);
    // The feeds wrap ids, positions and past: writing into them changes the next run's inputs.
    const feeds = this.decodeFeeds(ids, positions, past, cacheLength);
    const generation = this.weightsGeneration;
    return {
      ids,
      positions,
      run: async () => {
        if (generation !== this.weightsGeneration) throw new RlqError("invariant_violated", "decode: handle built for other weights");
        return this.runDecode(feeds);
      },
    };
  }

  private decodeFeeds(ids: Int32Array, positions: Int32Array, past: Float32Array[], cacheLength: number): OrtFeeds {
    const rows = ids.length;
    const { n_heads: nh, n_layers: nl } = this.config;
    const hd = headDim(this.config);
    // The graph cannot check these: a wrong shape broadcasts silently (ONNX broadcasting rules).
    if (positions.length !== rows || past.length !== 2 * nl) throw new RlqError("invariant_violated", "decode: inconsistent batch inputs");
    const feeds: OrtFeeds = { ...this.weightFeeds, input_ids: int32Tensor(ids, [rows]), positions: int32Tensor(positions, [rows]) };
    for (let l = 0; l < nl; l++) {
      for (const [i, kind] of [
        [0, "key"],
        [1, "value"],
      ] as const) {
        const data = past[2 * l + i] as Float32Array;
        if (data.length !== rows * nh * cacheLength * hd) throw new RlqError("invariant_violated", `decode: past.${l}.${kind} has ${data.length} values`);
        feeds[`past.${l}.${kind}`] = floatTensor(data, [rows, nh, cacheLength, hd]);
      }
    }
    return feeds;
  }

  private async runDecode(feeds: OrtFeeds): Promise<DecodeOutput> {
    const out = await this.decodeSession.run(feeds);
    const fresh: Float32Array[] = [];
    for (let l = 0; l < this.config.n_layers; l++) fresh.push(tensorFloats(out[`new.${l}.key`], "key"), tensorFloats(out[`new.${l}.value`], "value"));
    return { logits: tensorFloats(out.logits, "logits"), fresh };
  }

  async release(): Promise<void> {
    await this.prefillSession.release();
    await this.decodeSession.release();
  }
}
