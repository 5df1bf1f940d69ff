/**
 * A tiny seeded PRNG for the parity vectors and tests. Kept here rather than
 * shared with core/random.ts on purpose: the parity set is dumped to JSON and
 * checked by an outside trainer, so its numbers must never move because another
 * module's generator changed.
 */

/** mulberry32: uniform floats in [0, 1) from a 32-bit seed. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface Rng {
  /** Uniform in [lo, hi). */
  uniform(lo?: number, hi?: number): number;
  /** Standard normal (Box-Muller), times `std`. */
  normal(std?: number): number;
  /** Integer in [lo, hi]. */
  int(lo: number, hi: number): number;
  /** true with probability p. */
  chance(p: number): boolean;
}

export function makeRng(seed: number): Rng {
  const next = mulberry32(seed);
  return {
    uniform: (lo = 0, hi = 1) => lo + (hi - lo) * next(),
    normal: (std = 1) => {
      const u = 1 - next(); // (0, 1]: log stays finite
      const v = next();
      return std * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
    },
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    chance: (p) => next() < p,
  };
}
