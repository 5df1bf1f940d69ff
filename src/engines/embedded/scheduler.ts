/**
 * Continuous batching for the embedded engine. One `step()` is one scheduler
 * tick: swap weights if asked, admit waiting requests (prefilled together when
 * their prompts have the same length, one row per distinct prompt: a GRPO group's
 * samples share one), then one batched decode step for every active request. Requests join and leave
 * only between ticks, and weights change only between ticks.
 *
 * Determinism: the uniform that samples the token at absolute position p is
 * drawn from Prng(mixSeed(seed, p)), so a request's tokens depend only on its
 * seed, its input and the weights: not on the batch, and not on whether it was
 * interrupted and continued from its partial tokens.
 */

import { randomInt } from "node:crypto";
import { mixSeed, Prng, uniformAt } from "../../model/prng.ts";
import type { Weights } from "../../model/weights.ts";
import type { FinishReason, GenerateRequest } from "../engine.ts";
import { SlotKvCache } from "./kv-cache.ts";
import type { DecodeHandle, ModelRunner } from "./model-runner.ts";
import { logitNoise, sampleToken } from "./sampler.ts";

export interface SchedulerResult {
  tokenIds: number[];
  logProbs: number[];
  finishReason: FinishReason;
  weightVersion: number;
}

export interface SchedulerEvents {
  done(requestId: string, result: SchedulerResult): void;
  failed(requestId: string, message: string): void;
}

interface Sequence {
  request: GenerateRequest;
  seed: number;
  /** Input followed by generated tokens. */
  tokens: number[];
  generated: number[];
  logProbs: number[];
}

export class DecodeScheduler {
  private readonly waiting: Sequence[] = [];
  /** active[i] lives in cache slot i. */
  private readonly active: Sequence[] = [];
  private readonly cache: SlotKvCache;
  private pendingSwap: { version: number; weights: Weights; resolve: () => void } | null = null;
  /** Decode feeds per row count, built once per weight version (ModelRunner.decodeHandle). */
  private readonly handles = new Map<number, DecodeHandle>();

  constructor(
    private readonly runner: ModelRunner,
    private version: number,
    private readonly events: SchedulerEvents,
    private readonly opts: { maxBatchSize: number; logitNoiseStd: number },
  ) {
    this.cache = new SlotKvCache(runner.config, Math.max(2, opts.maxBatchSize));
  }

  get weightVersion(): number {
    return this.version;
  }

  get isIdle(): boolean {
    return this.waiting.length === 0 && this.active.length === 0 && this.pendingSwap === null;
  }

  /** Queue a request (already schema-validated); it joins the batch at the next tick. */
  submit(request: GenerateRequest): void {
    const { vocab_size: vocab } = this.runner.config;
    const bad = request.inputIds.find((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
    if (bad !== undefined) {
      this.events.failed(request.requestId, `inputIds contains token ${bad}, outside the vocabulary of ${vocab} (ids 0 to ${vocab - 1})`);
      return;
    }
    const seed = request.sampling.seed ?? randomInt(2 ** 31);
    this.waiting.push({ request, seed, tokens: [...request.inputIds], generated: [], logProbs: [] });
  }

  /** Finish these requests now with their tokens so far (unknown ids are ignored). */
  abort(ids: readonly string[]): void {
    const wanted = new Set(ids);
    for (let i = this.waiting.length - 1; i >= 0; i--) {
      const seq = this.waiting[i] as Sequence;
      if (wanted.has(seq.request.requestId)) {
        this.waiting.splice(i, 1);
        this.finish(seq, "abort");
      }
    }
    for (let i = this.active.length - 1; i >= 0; i--) {
      if (wanted.has((this.active[i] as Sequence).request.requestId)) this.leave(i, "abort");
    }
  }

  /**
   * Serve `weights` as `version` from the next tick. In-flight requests end there
   * with finishReason "abort" (one call = one weight version; the caller resumes
   * them as new segments). Resolves once the new version is live.
   */
  swapWeights(version: number, weights: Weights): Promise<void> {
    return new Promise((resolve) => {
      this.pendingSwap?.resolve(); // superseded: its version was never served
      this.pendingSwap = { version, weights, resolve };
    });
  }

  /** One tick. Returns the number of tokens generated. */
  async step(): Promise<number> {
    if (this.pendingSwap) {
      const swap = this.pendingSwap;
      this.pendingSwap = null;
      for (let i = this.active.length - 1; i >= 0; i--) this.leave(i, "abort");
      this.runner.setWeights(swap.weights);
      this.handles.clear();
      this.version = swap.version;
      swap.resolve();
    }
    let produced = 0;
    const ctx = this.runner.config.context_length;
    const admitted: Sequence[] = [];
    while (this.waiting.length > 0 && this.active.length + admitted.length < this.opts.maxBatchSize) {
      const seq = this.waiting.shift() as Sequence;
      if (seq.request.sampling.maxNewTokens === 0 || seq.tokens.length >= ctx) this.finish(seq, "length");
      else admitted.push(seq);
    }
    // Same-length prompts go through one prefill, in arrival order within each length. Rows are
    // never padded: padding would change the attention's reduction lengths and so the rounding,
    // and a request's tokens must not depend on its batch-mates. A one-token prompt never shares
    // a prefill with another token: a single-row MatMul takes ORT's GEMV path, which rounds
    // differently from a batch's GEMM (identical one-token prompts share their one row, below).
    const byLength = new Map<number, Sequence[]>();
    for (const seq of admitted) {
      const key = seq.tokens.length === 1 ? -1 - (seq.tokens[0] as number) : seq.tokens.length;
      const list = byLength.get(key);
      if (list) list.push(seq);
      else byLength.set(key, [seq]);
    }
    for (const group of byLength.values()) produced += await this.admit(group);
    if (this.active.length > 0) produced += await this.decodeStep();
    return produced;
  }

  /**
   * Prefill requests with prompts of one length together and sample each one's first token.
   * Identical prompts (a GRPO group's samples, sent together) share one prefill row: its logits
   * and keys/values are the same as a row of their own would give (a row's prefill does not
   * depend on its batch-mates), so each request samples from that row with its own seed and
   * gets a copy of the row's keys/values in its own cache slot. SGLang shares them through its
   * radix cache (python/sglang/srt/mem_cache/radix_cache.py); this shares only exact matches
   * within one admission, and keeps no cache across ticks.
   */
  private async admit(group: Sequence[]): Promise<number> {
    const n = (group[0] as Sequence).tokens.length;
    const rowOf = new Map<string, number>();
    const rows = new Int32Array(group.length); // group[i] samples from prefill row rows[i]
    const unique: Sequence[] = [];
    group.forEach((seq, i) => {
      const key = seq.tokens.join(",");
      let row = rowOf.get(key);
      if (row === undefined) {
        row = unique.length;
        rowOf.set(key, row);
        unique.push(seq);
      }
      rows[i] = row;
    });
    const ids = new Int32Array(unique.length * n); // [rows, n]
    unique.forEach((seq, row) => ids.set(seq.tokens, row * n));
    const out = await this.runner.prefill(ids, unique.length, n);
    const vocab = this.runner.config.vocab_size;
    group.forEach((seq, i) => {
      const row = rows[i] as number;
      this.sample(seq, out.logits, (row * n + n - 1) * vocab);
      const reason = this.finishReason(seq);
      if (reason) {
        this.finish(seq, reason);
      } else {
        this.cache.writePrefill(this.active.length, out.present, n, row);
        this.active.push(seq);
      }
    });
    return group.length;
  }

  private async decodeStep(): Promise<number> {
    const b = this.active.length;
    // ORT's MatMul takes a GEMV path for a single row whose rounding differs from
    // the GEMM path used for 2+ rows (measured: ~1e-7). Padding B=1 to 2 rows
    // keeps a request's logits bit-identical whatever the batch size.
    const rows = Math.max(b, 2);
    let handle = this.handles.get(rows);
    if (!handle) {
      handle = this.runner.decodeHandle(rows, this.cache.views(rows), this.cache.length);
      this.handles.set(rows, handle);
    }
    const { ids, positions } = handle;
    // A padding row (B=1) decodes token 0 at position 0 of an unused slot, as before.
    ids.fill(0);
    positions.fill(0);
    for (let i = 0; i < b; i++) {
      const tokens = (this.active[i] as Sequence).tokens;
      positions[i] = tokens.length - 1; // the last sampled token, not yet in the cache
      ids[i] = tokens[tokens.length - 1] as number;
    }
    const out = await handle.run();
    this.cache.writeDecode(out.fresh, b === rows ? positions : positions.subarray(0, b));
    const vocab = this.runner.config.vocab_size;
    for (let i = 0; i < b; i++) this.sample(this.active[i] as Sequence, out.logits, i * vocab);
    for (let i = b - 1; i >= 0; i--) {
      const reason = this.finishReason(this.active[i] as Sequence);
      if (reason) this.leave(i, reason);
    }
    return b;
  }

  /** Sample `seq`'s next token from the vocabulary-long row of `logits` at `offset`. */
  private sample(seq: Sequence, logits: Float32Array, offset: number): void {
    const position = seq.tokens.length;
    const vocab = this.runner.config.vocab_size;
    const noise = logitNoise(this.opts.logitNoiseStd > 0 ? new Prng(mixSeed(seq.seed, position, 1)) : null, vocab, this.opts.logitNoiseStd);
    const u = uniformAt(mixSeed(seq.seed, position));
    const { token, logProb } = sampleToken(logits, seq.request.sampling, u, noise, offset, vocab);
    seq.tokens.push(token);
    seq.generated.push(token);
    seq.logProbs.push(logProb);
  }

  private finishReason(seq: Sequence): FinishReason | null {
    const last = seq.generated[seq.generated.length - 1];
    if (last !== undefined && seq.request.sampling.stopTokenIds.includes(last)) return "stop";
    if (seq.generated.length >= seq.request.sampling.maxNewTokens) return "length";
    if (seq.tokens.length >= this.runner.config.context_length) return "length";
    return null;
  }

  /** Remove active[i], moving the last slot into its place. */
  private leave(i: number, reason: FinishReason): void {
    const seq = this.active[i] as Sequence;
    const last = this.active.length - 1;
    this.cache.move(last, i);
    this.active[i] = this.active[last] as Sequence;
    this.active.pop();
    this.finish(seq, reason);
  }

  private finish(seq: Sequence, finishReason: FinishReason): void {
    this.events.done(seq.request.requestId, {
      tokenIds: seq.generated,
      logProbs: seq.logProbs,
      finishReason,
      weightVersion: this.version,
    });
  }
}
