/**
 * Fixed-slot KV cache owned by JS: per layer one key and one value buffer of
 * [capacity, H, S, hd] float32, S = context_length. Active requests occupy slots
 * 0..B-1 so the first B slots are one contiguous block fed to ORT zero-copy;
 * when a request leaves, the last slot is moved into its place (one slot copy,
 * 2 * layers * H * S * hd floats) instead of compacting the batch.
 */

import { headDim, type ModelConfig } from "../../model/config.ts";

export class SlotKvCache {
  readonly buffers: Float32Array[];
  /** The same memory as `buffers`, as int32: the writes copy bits, not floats, which is faster. */
  private readonly bits: Int32Array[];
  readonly slotSize: number;
  private readonly heads: number;
  private readonly hd: number;
  readonly length: number;

  constructor(
    config: ModelConfig,
    readonly capacity: number,
  ) {
    this.heads = config.n_heads;
    this.hd = headDim(config);
    this.length = config.context_length;
    this.slotSize = this.heads * this.length * this.hd;
    this.buffers = Array.from({ length: 2 * config.n_layers }, () => new Float32Array(capacity * this.slotSize));
    this.bits = this.buffers.map((b) => new Int32Array(b.buffer, b.byteOffset, b.length));
  }

  /** Views of the first `batch` slots, index 2l = key, 2l+1 = value: [batch, H, S, hd]. */
  views(batch: number): Float32Array[] {
    return this.buffers.map((b) => b.subarray(0, batch * this.slotSize));
  }

  /**
   * Store row `row` of a prefill's keys/values into `slot` at positions 0..seqLen-1.
   * @param present per buffer [rows, H, seqLen, hd]
   */
  writePrefill(slot: number, present: readonly Float32Array[], seqLen: number, row = 0): void {
    const { hd, heads, length, slotSize } = this;
    const rowFloats = seqLen * hd;
    for (let i = 0; i < present.length; i++) {
      const p = present[i] as Float32Array;
      const src = new Int32Array(p.buffer, p.byteOffset, p.length);
      const dst = this.bits[i] as Int32Array;
      let from = row * heads * rowFloats;
      for (let h = 0; h < heads; h++) {
        const to = slot * slotSize + h * length * hd;
        for (let k = 0; k < rowFloats; k++) dst[to + k] = src[from + k] as number;
        from += rowFloats;
      }
    }
  }

  /**
   * Store one decode step's new keys/values, row b at slot b, position positions[b].
   * @param fresh per buffer [B, H, 1, hd]
   */
  writeDecode(fresh: readonly Float32Array[], positions: Int32Array): void {
    const b = positions.length;
    const { hd, heads, length, slotSize } = this;
    // Plain loops over locals, not subarray + set nor forEach: a view per (row, head, buffer) was
    // ~1k allocations per tick at B=64, a visible share of a small model's decode
    // (bench/embedded-model.ts), and the closure a few per cent more.
    for (let i = 0; i < fresh.length; i++) {
      const f = fresh[i] as Float32Array;
      const src = new Int32Array(f.buffer, f.byteOffset, f.length);
      const dst = this.bits[i] as Int32Array;
      let from = 0;
      for (let row = 0; row < b; row++) {
        const rowBase = row * slotSize + (positions[row] as number) * hd;
        for (let h = 0; h < heads; h++) {
          const to = rowBase + h * length * hd;
          for (let k = 0; k < hd; k++) dst[to + k] = src[from + k] as number;
          from += hd;
        }
      }
    }
  }

  /** Copy slot `from` over slot `to` (used when a request leaves the batch). */
  move(from: number, to: number): void {
    if (from === to) return;
    for (const buf of this.buffers) buf.copyWithin(to * this.slotSize, from * this.slotSize, (from + 1) * this.slotSize);
  }
}
