import { describe, expect, it } from "vitest";
import { computeCispoLoss, computeGspoKl, computeOpsmMask, computePolicyLoss, ppoClipToken } from "./policy-loss.ts";

/** Central finite difference of a scalar function of one variable. */
function fd(f: (x: number) => number, x: number, h = 1e-6): number {
  return (f(x + h) - f(x - h)) / (2 * h);
}

describe("computePolicyLoss (PPO clip, dual clip)", () => {
  it("reproduces slime's pinned dual-clip vector", () => {
    // tests/test_policy_loss.py: ratios [2, 2, 0.5], A [2, -2, 2], eps 0.2/0.2, c 1.5.
    // t0: L1 = -2*2 = -4, L2 = -clamp(2, .8, 1.2)*2 = -2.4, max = -2.4 (A >= 0, no dual clip)
    // t1: L1 = -2*-2 = 4, L2 = -1.2*-2 = 2.4, max = 4; dual: L3 = -1.5*-2 = 3, min(3, 4) = 3
    // t2: L1 = -0.5*2 = -1, L2 = -0.8*2 = -1.6, max = -1
    const ppoKl = [2, 2, 0.5].map((r) => -Math.log(r));
    const out = computePolicyLoss(ppoKl, [2, -2, 2], 0.2, 0.2, 1.5);
    expect(out.loss[0]).toBeCloseTo(-2.4, 12);
    expect(out.loss[1]).toBeCloseTo(3.0, 12);
    expect(out.loss[2]).toBeCloseTo(-1.0, 12);
    // clipfrac = 1[L2 > L1], before dual clip: t0 -2.4 > -4 yes; t1 2.4 > 4 no; t2 -1.6 > -1 no.
    expect(Array.from(out.clipfrac)).toEqual([1, 0, 0]);
    // d/d ratio: t0 clamp saturated -> 0; t1 dual-clip constant wins -> 0; t2 unclipped -> -A = -2.
    expect(out.dLoss_dRatio[0]).toBe(0);
    expect(out.dLoss_dRatio[1]).toBe(0);
    expect(out.dLoss_dRatio[2]).toBe(-2);
  });

  it("without eps_clip_c the negative-advantage token keeps max(L1, L2) = 4", () => {
    const out = computePolicyLoss([-Math.log(2)], [-2], 0.2, 0.2, null);
    expect(out.loss[0]).toBeCloseTo(4, 12);
    // L1 = 4 wins, so the gradient is -A = 2.
    expect(out.dLoss_dRatio[0]).toBe(2);
  });

  it("uses eps_clip_high for the upper bound only", () => {
    // eps 0.2 / 0.28: bounds [0.8, 1.28].
    // r = 1.3, A = 1: L1 = -1.3, L2 = -1.28 -> -1.28, clipped, grad 0.
    // r = 1.25, A = 1: inside -> -1.25, grad -1.
    // r = 0.7, A = -1: L1 = 0.7, L2 = 0.8 -> 0.8, clipped, grad 0.
    const a = ppoClipToken(1.3, 1, 0.2, 0.28, null);
    const b = ppoClipToken(1.25, 1, 0.2, 0.28, null);
    const c = ppoClipToken(0.7, -1, 0.2, 0.28, null);
    expect(a.loss).toBeCloseTo(-1.28, 12);
    expect([a.clipfrac, a.dLoss_dRatio]).toEqual([1, 0]);
    expect(b.loss).toBeCloseTo(-1.25, 12);
    expect([b.clipfrac, b.dLoss_dRatio]).toEqual([0, -1]);
    expect(c.loss).toBeCloseTo(0.8, 12);
    expect([c.clipfrac, c.dLoss_dRatio]).toEqual([1, 0]);
  });

  it("follows torch's tie rules at the clip boundary and the dual-clip crossing", () => {
    // r = 1.25 exactly on the upper bound (eps_high 0.25): L1 = L2 = -1.25; both branches have
    // gradient -A (clamp passes on the closed interval), so 0.5*(-1) + 0.5*(-1) = -1.
    const edge = ppoClipToken(1.25, 1, 0.2, 0.25, null);
    expect([edge.loss, edge.clipfrac, edge.dLoss_dRatio]).toEqual([-1.25, 0, -1]);
    // A = -1, r = 2, c = 2: max(L1 = 2, L2 = 1.25) = 2 ties L3 = 2: torch.min gives half of -A = 0.5.
    const dual = ppoClipToken(2, -1, 0.2, 0.25, 2);
    expect([dual.loss, dual.dLoss_dRatio]).toEqual([2, 0.5]);
  });

  it("matches a central finite difference away from kinks", () => {
    const cases: [number, number, number | null][] = [
      [1.1, 0.7, null],
      [1.5, 0.7, null],
      [0.5, -1.3, null],
      [3.0, -1.3, 1.5],
      [2.2, -0.4, 3],
      [0.9, -2, 3],
    ];
    for (const [r, a, c] of cases) {
      const g = ppoClipToken(r, a, 0.2, 0.3, c).dLoss_dRatio;
      expect(g).toBeCloseTo(
        fd((x) => ppoClipToken(x, a, 0.2, 0.3, c).loss, r),
        7,
      );
    }
  });

  it("rejects eps_clip_c <= 1", () => {
    expect(() => computePolicyLoss([0], [1], 0.2, 0.2, 1)).toThrow(/eps_clip_c/);
  });
});

describe("computeCispoLoss", () => {
  it("matches slime's CISPO vectors (eps 0.2 / 0.28)", () => {
    // ratios [1, 1.14, 1.56, 0.4] clamp to [0.8, 1.28] -> [1, 1.14, 1.28, 0.8]
    // loss = -clamped*A*logp, A = [1, -0.5, 2, -1], logp = [-0.7, -1.2, -0.4, -2.1]:
    //   -1*1*-0.7 = 0.7; -1.14*-0.5*-1.2 = -0.684; -1.28*2*-0.4 = 1.024; -0.8*-1*-2.1 = -1.68
    // d/dlogp = -clamped*A = [-1, 0.57, -2.56, 0.8]
    const ppoKl = [1, 1.14, 1.56, 0.4].map((r) => -Math.log(r));
    const out = computeCispoLoss(ppoKl, [-0.7, -1.2, -0.4, -2.1], [1, -0.5, 2, -1], 0.2, 0.28);
    const expected = [0.7, -0.684, 1.024, -1.68];
    expected.forEach((v, t) => expect(out.loss[t]).toBeCloseTo(v, 12));
    expect(Array.from(out.clipfrac)).toEqual([0, 0, 1, 1]);
    [-1, 0.57, -2.56, 0.8].forEach((v, t) => expect(out.dLoss_dLogp[t]).toBeCloseTo(v, 12));
  });

  it("gradient equals a finite difference with the clipped ratio held fixed (stop-gradient)", () => {
    // Shifting logp and old together keeps ratio fixed, so only the explicit logp factor moves.
    const old = -1.1;
    const logp = -0.2; // ratio = e^0.9 ≈ 2.46, clipped to 1.28
    const a = 0.8;
    const f = (x: number): number => computeCispoLoss([old + (x - logp) - x], [x], [a], 0.2, 0.28).loss[0] as number;
    const g = computeCispoLoss([old - logp], [logp], [a], 0.2, 0.28).dLoss_dLogp[0] as number;
    expect(g).toBeCloseTo(-1.28 * 0.8, 12);
    expect(g).toBeCloseTo(fd(f, logp), 7);
  });
});

describe("computeGspoKl", () => {
  it("is the masked sequence mean of old - logp, broadcast", () => {
    // old - logp = [0.5, 0, 1], mask [1, 1, 0]: (0.5 + 0) / 2 = 0.25 on every token.
    const out = computeGspoKl([[-1, -2, -3], [-1, -1], []], [[-0.5, -2, -2], [0, 0], []], [[1, 1, 0], [0, 0], []]);
    expect(Array.from(out[0] ?? [])).toEqual([0.25, 0.25, 0.25]);
    // fully masked: 0 / max(0, 1) = 0; empty response: []
    expect(Array.from(out[1] ?? [])).toEqual([0, 0]);
    expect(out[2]?.length).toBe(0);
  });
});

describe("computeOpsmMask", () => {
  it("zeroes negative-advantage tokens of sequences that drifted more than opsm_delta", () => {
    // sample 0: seq_kl = 0.25 > 1e-4; A = [1, -1, -1] -> mask [1, 0, 0]; clipfrac 2 / max(2, 1) = 1
    // sample 1: logp = old -> seq_kl = 0 -> mask [1, 1]
    const out = computeOpsmMask(
      [
        [-1, -2, -3],
        [-1, -1],
      ],
      [
        [-0.5, -2, -2],
        [-1, -1],
      ],
      [
        [1, -1, -1],
        [-1, -1],
      ],
      [
        [1, 1, 0],
        [1, 1],
      ],
      1e-4,
    );
    expect(Array.from(out.mask[0] ?? [])).toEqual([1, 0, 0]);
    expect(Array.from(out.mask[1] ?? [])).toEqual([1, 1]);
    expect(out.clipfracSum).toBe(1);
  });
});
