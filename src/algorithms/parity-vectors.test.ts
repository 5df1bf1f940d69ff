import { describe, expect, it } from "vitest";
import { evaluateParityCase, makeParityVectors, type ParityCase, type ParityFunction } from "./parity-vectors.ts";
import { makeRng, mulberry32 } from "./prng.ts";

/** Every number in a JSON value, depth first. */
function numbers(x: unknown, out: number[] = []): number[] {
  if (typeof x === "number") out.push(x);
  else if (Array.isArray(x)) for (const y of x) numbers(y, out);
  else if (x !== null && typeof x === "object") for (const y of Object.values(x)) numbers(y, out);
  return out;
}

function maxAbsDiff(a: unknown, b: unknown): number {
  const x = numbers(a);
  const y = numbers(b);
  expect(x.length).toBe(y.length);
  return x.reduce((m, v, i) => Math.max(m, Math.abs(v - (y[i] as number))), 0);
}

describe("mulberry32", () => {
  it("is deterministic and seed-dependent", () => {
    // First draw for seed 1: a = 1 + 0x6d2b79f5 = 0x6d2b79f6, then the mulberry32 mix -> 0.6270739405881613
    expect(mulberry32(1)()).toBeCloseTo(0.6270739405881613, 15);
    expect(mulberry32(2)()).not.toBe(mulberry32(1)());
    const r = makeRng(5);
    const draws = Array.from({ length: 1000 }, () => r.uniform());
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
  });
});

describe("makeParityVectors", () => {
  const vectors = makeParityVectors();

  it("is deterministic: two calls give identical JSON", () => {
    expect(JSON.stringify(makeParityVectors())).toBe(JSON.stringify(vectors));
  });

  it("depends on the seed", () => {
    expect(JSON.stringify(makeParityVectors(7).cases)).not.toBe(JSON.stringify(vectors.cases));
  });

  it("is plain JSON: every case re-evaluates from its parsed JSON to the stored output", () => {
    const parsed = JSON.parse(JSON.stringify(vectors)) as typeof vectors;
    for (const c of parsed.cases) {
      expect(maxAbsDiff(evaluateParityCase(c.fn, c.input, c.options), c.output), c.name).toBeLessThanOrEqual(1e-12);
    }
  });

  it("detects a changed input (the check can fail)", () => {
    const c = vectors.cases.find((x) => x.name === "policy loss ppo defaults") as ParityCase;
    const adv = (c.input.advantages as number[][]).map((r) => r.map((v) => v * 1.01));
    const changed = evaluateParityCase(c.fn, { ...c.input, advantages: adv }, c.options);
    expect(maxAbsDiff(changed, c.output)).toBeGreaterThan(1e-6);
  });

  it("contains slime's pinned vector", () => {
    const c = vectors.cases.find((x) => x.name === "policy loss slime pinned dual clip") as ParityCase;
    const pg = (c.output.pgLoss as number[][])[0] as number[];
    [-2.4, 3, -1].forEach((v, i) => expect(pg[i]).toBeCloseTo(v, 12));
  });

  it("covers every function, estimator, KL type and off-policy correction, with finite numbers only", () => {
    const fns = new Set(vectors.cases.map((c) => c.fn));
    const all: ParityFunction[] = [
      "postProcessRewards",
      "computeAdvantagesAndReturns",
      "computeApproxKl",
      "klLossWithGrad",
      "computePolicyLossTerms",
      "computeMisWeights",
      "aggregate",
      "logProbsAndEntropyFromLogits",
      "passAtK",
      "computeValueLossTerms",
    ];
    for (const fn of all) expect(fns.has(fn), fn).toBe(true);
    const opts = vectors.cases.map((c) => JSON.stringify(c.options));
    for (const needle of [
      '"advantage_estimator":"grpo"',
      '"advantage_estimator":"gspo"',
      '"advantage_estimator":"cispo"',
      '"advantage_estimator":"reinforce_plus_plus"',
      '"advantage_estimator":"reinforce_plus_plus_baseline"',
      '"advantage_estimator":"ppo"',
      '"kl_loss_type":"k2"',
      '"kl_loss_type":"low_var_kl"',
      '"use_unbiased_kl":true',
      '"tis_function":"icepop"',
      '"tis_function":"mis"',
      '"use_rollout_logprobs":true',
      '"calculate_per_token_loss":true',
      '"use_opsm":true',
      '"eps_clip_c":3',
    ]) {
      expect(
        opts.some((o) => o.includes(needle)),
        needle,
      ).toBe(true);
    }
    expect(numbers(vectors.cases).every(Number.isFinite)).toBe(true);
  });

  it("exercises the interesting branches: clipping, MIS rejection, veto, the low_var_kl clamp", () => {
    const byName = (n: string): ParityCase => vectors.cases.find((c) => c.name === n) as ParityCase;
    expect(byName("policy loss ppo defaults").output.metrics).toMatchObject({ pg_clipfrac: expect.any(Number) });
    expect((byName("policy loss ppo defaults").output.metrics as Record<string, number>).pg_clipfrac).toBeGreaterThan(0);
    const mis = byName("policy loss mis yaml defaults (token truncate, rs, veto, batch norm)");
    const misMetrics = mis.output.metrics as Record<string, number>;
    expect(misMetrics.mis_rs_catastrophic_seq_fraction).toBeGreaterThan(0);
    expect(numbers(mis.output.effectiveLossMask).filter((v) => v === 0).length).toBeGreaterThan(numbers(mis.input.lossMask).filter((v) => v === 0).length);
    expect(numbers(byName("kl low_var_kl").output.kl)).toContain(10);
  });
});
