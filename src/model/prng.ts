/**
 * Seeded pseudo-random numbers for everything that must replay: weight init,
 * sampling in the engine, the demo's data. Never Math.random: a retried train
 * step or a re-run with the same seed must see the same stream.
 *
 * xoshiro128** (Blackman & Vigna) seeded through splitmix32. Pure 32-bit integer
 * arithmetic, so the stream is identical on every platform and Node version.
 */
export class Prng {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private spareNormal: number | null = null;

  constructor(seed: number) {
    // splitmix32 spreads a small integer seed over all 128 state bits. Inline, not a closure: the
    // embedded engine builds one Prng per sampled token (scheduler.ts), so this runs per token.
    const x = seed >>> 0;
    this.s0 = splitmix32(x, 1);
    this.s1 = splitmix32(x, 2);
    this.s2 = splitmix32(x, 3);
    this.s3 = splitmix32(x, 4);
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1;
  }

  /** Uniform 32-bit unsigned integer. */
  nextUint32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5) >>> 0, 7), 9) >>> 0;
    const t = (this.s1 << 9) >>> 0;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    this.s0 >>>= 0;
    this.s1 >>>= 0;
    this.s2 >>>= 0;
    this.s3 >>>= 0;
    return result;
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const hi = this.nextUint32() >>> 5; // 27 bits
    const lo = this.nextUint32() >>> 6; // 26 bits
    return (hi * 67_108_864 + lo) / 9_007_199_254_740_992;
  }

  /** Uniform integer in [0, n). */
  nextInt(n: number): number {
    return Math.floor(this.nextFloat() * n);
  }

  /** Standard normal (Box-Muller, both values used). */
  nextNormal(): number {
    if (this.spareNormal !== null) {
      const v = this.spareNormal;
      this.spareNormal = null;
      return v;
    }
    let u = this.nextFloat();
    while (u === 0) u = this.nextFloat();
    const v = this.nextFloat();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spareNormal = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }
}

/**
 * `new Prng(seed).nextFloat()` without the object: the embedded engine draws one uniform per
 * sampled token from a fresh stream (scheduler.ts), so this runs per token. Same arithmetic as
 * the constructor and two `nextUint32` calls (prng.test.ts checks equality).
 */
export function uniformAt(seed: number): number {
  const x = seed >>> 0;
  let s0 = splitmix32(x, 1);
  const s1 = splitmix32(x, 2);
  const s2 = splitmix32(x, 3);
  const s3 = splitmix32(x, 4);
  if ((s0 | s1 | s2 | s3) === 0) s0 = 1;
  const first = Math.imul(rotl(Math.imul(s1, 5) >>> 0, 7), 9) >>> 0;
  // The first nextUint32 leaves s1 ^ (s2 ^ s0) in s1, the only state the second result reads.
  const next = (s1 ^ s2 ^ s0) >>> 0;
  const second = Math.imul(rotl(Math.imul(next, 5) >>> 0, 7), 9) >>> 0;
  return ((first >>> 5) * 67_108_864 + (second >>> 6)) / 9_007_199_254_740_992;
}

/** The i-th (1-based) output of splitmix32 started at `x`. */
function splitmix32(x: number, i: number): number {
  let z = (x + Math.imul(i, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** FNV-1a 32-bit hash: derives stable sub-seeds from names ("init:blocks.0.attn"). */
export function hashString(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** A sub-seed for `label` under `seed`, so adding a tensor does not shift the others' streams. */
export function deriveSeed(seed: number, label: string): number {
  return hashString(label, (hashString(String(seed >>> 0)) ^ 0x9e3779b9) >>> 0);
}

/** Combine integers into one 32-bit seed (order matters): e.g. (request seed, token position). */
export function mixSeed(...parts: number[]): number {
  let h = 0x9e3779b9;
  for (const part of parts) {
    h = Math.imul(h ^ (part >>> 0), 0x85ebca6b) >>> 0;
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
    h = (h ^ (h >>> 16)) >>> 0;
  }
  return h;
}
