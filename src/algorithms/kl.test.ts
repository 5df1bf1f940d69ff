import { describe, expect, it } from "vitest";
import { approxKlTokenWithGrad, computeApproxKl, klLossWithGrad } from "./kl.ts";
import type { KlType } from "./options.ts";

function fd(f: (x: number) => number, x: number, h = 1e-6): number {
  return (f(x + h) - f(x - h)) / (2 * h);
}

describe("computeApproxKl", () => {
  // logp = 0.5, base = 0.2: d = 0.3; exp(-0.3) = 0.7408182206817179
  it("k1 = d", () => {
    expect(computeApproxKl([0.5], [0.2], "k1")[0]).toBeCloseTo(0.3, 14);
  });
  it("k2 = d^2 / 2 = 0.045", () => {
    expect(computeApproxKl([0.5], [0.2], "k2")[0]).toBeCloseTo(0.045, 14);
  });
  it("k3 = exp(-d) - 1 + d = 0.7408182206817179 - 0.7 = 0.0408182206817179", () => {
    expect(computeApproxKl([0.5], [0.2], "k3")[0]).toBeCloseTo(0.040818220681717865, 14);
    expect(computeApproxKl([0.5], [0.2], "low_var_kl")[0]).toBeCloseTo(0.040818220681717865, 14);
  });
  it("multiplies by the importance ratio", () => {
    // 2 * 0.0408182206817179 = 0.0816364413634357; k1: 0.5 * 0.3 = 0.15
    expect(computeApproxKl([0.5], [0.2], "k3", [2])[0]).toBeCloseTo(0.08163644136343573, 14);
    expect(computeApproxKl([0.5], [0.2], "k1", [0.5])[0]).toBeCloseTo(0.15, 14);
  });
  it("clamps low_var_kl to 10 but never k3", () => {
    // logp = -5, base = 5: d = -10, k3 = e^10 - 1 - 10 = 22015.465794806718
    expect(computeApproxKl([-5], [5], "k3")[0]).toBeCloseTo(22015.465794806718, 8);
    expect(computeApproxKl([-5], [5], "low_var_kl")[0]).toBe(10);
  });
  it("clamps after the ratio multiply", () => {
    // d = -2.5: k3 = e^2.5 - 3.5 = 12.182493960703473 - 3.5 = 8.682493960703473 (< 10, unclamped);
    // times ratio 2 = 17.36 -> clamped to 10. Clamping first would give 8.68 * 2 = 17.36.
    expect(computeApproxKl([0], [2.5], "low_var_kl")[0]).toBeCloseTo(8.682493960703473, 12);
    expect(computeApproxKl([0], [2.5], "low_var_kl", [2])[0]).toBe(10);
  });
  it("rejects mismatched lengths", () => {
    expect(() => computeApproxKl([0, 1], [0], "k1")).toThrow(/baseLogProbs/);
  });
});

describe("KL gradients", () => {
  it("hand values: k1' = 1, k2' = d = 0.3, k3' = 1 - exp(-d) = 0.2591817793182821", () => {
    expect(approxKlTokenWithGrad(0.5, 0.2, "k1").grad).toBe(1);
    expect(approxKlTokenWithGrad(0.5, 0.2, "k2").grad).toBeCloseTo(0.3, 14);
    expect(approxKlTokenWithGrad(0.5, 0.2, "k3").grad).toBeCloseTo(0.2591817793182821, 14);
  });

  it("low_var_kl has zero gradient where the clamp is active", () => {
    expect(approxKlTokenWithGrad(-5, 5, "low_var_kl")).toEqual({ value: 10, grad: 0 });
    // k3 keeps its gradient there: 1 - e^10 = -22025.465794806718
    expect(approxKlTokenWithGrad(-5, 5, "k3").grad).toBeCloseTo(1 - Math.exp(10), 6);
  });

  it("unbiased KL: d(r*k)/dlogp = r*k + r*k' with r = exp(logp - old)", () => {
    // logp 0.5, ref 0.2, old 0.5 - ln 2: r = 2; k1: 2*0.3 + 2*1 = 2.6
    const { value, grad } = klLossWithGrad([0.5], [0.2], "k1", [0.5 - Math.log(2)]);
    expect(value[0]).toBeCloseTo(0.6, 12);
    expect(grad[0]).toBeCloseTo(2.6, 12);
  });

  it("every type, with and without the ratio, matches a central finite difference", () => {
    const types: KlType[] = ["k1", "k2", "k3", "low_var_kl"];
    const points = [
      { logp: -0.7, ref: -1.1, old: -0.9 },
      { logp: -2.3, ref: -0.4, old: -2.0 },
      { logp: -0.05, ref: -3.0, old: -0.5 },
    ];
    for (const type of types) {
      for (const p of points) {
        for (const old of [undefined, [p.old]]) {
          const f = (x: number): number => klLossWithGrad([x], [p.ref], type, old).value[0] as number;
          const g = klLossWithGrad([p.logp], [p.ref], type, old).grad[0] as number;
          expect(g).toBeCloseTo(fd(f, p.logp), 6);
        }
      }
    }
  });

  it("low_var_kl with the ratio: the clamped region has zero finite difference too", () => {
    // logp 0, ref 2.5, old -1: r = e, k3 = 8.68, r*k3 = 23.6 > 10 -> flat.
    const f = (x: number): number => klLossWithGrad([x], [2.5], "low_var_kl", [-1]).value[0] as number;
    expect(klLossWithGrad([0], [2.5], "low_var_kl", [-1]).grad[0]).toBe(0);
    expect(fd(f, 0)).toBe(0);
  });
});
