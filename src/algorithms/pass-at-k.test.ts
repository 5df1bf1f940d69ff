import { describe, expect, it } from "vitest";
import { meanPassAtK, passAtK } from "./pass-at-k.ts";

describe("passAtK", () => {
  it("hand values", () => {
    // n 5, c 2, k 1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4  [product: (1 - 1/4)(1 - 1/5) = 0.6]
    expect(passAtK(5, 2, 1)).toBeCloseTo(0.4, 14);
    // n 5, c 2, k 2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7  [product: (1 - 2/4)(1 - 2/5) = 0.3]
    expect(passAtK(5, 2, 2)).toBeCloseTo(0.7, 14);
    // n 4, c 3, k 2: n - c = 1 < 2 -> 1
    expect(passAtK(4, 3, 2)).toBe(1);
    expect(passAtK(8, 0, 4)).toBe(0);
    expect(passAtK(8, 8, 1)).toBe(1);
  });

  it("is stable where the binomials overflow", () => {
    // n 100, c 1, k 50: 1 - C(99,50)/C(100,50) = 1 - 50/100 = 0.5
    expect(passAtK(100, 1, 50)).toBeCloseTo(0.5, 12);
    // n 4000, c 1, k 1000: 1 - (4000-1000)/4000 = 0.25; C(4000, 1000) overflows float64
    expect(passAtK(4000, 1, 1000)).toBeCloseTo(0.25, 12);
  });

  it("refuses k > n and bad counts", () => {
    expect(() => passAtK(4, 0, 5)).toThrow(/k must be/);
    expect(() => passAtK(4, 5, 1)).toThrow(/c must be/);
    expect(() => passAtK(0, 0, 1)).toThrow(/n must be/);
  });
});

describe("meanPassAtK", () => {
  it("averages over problems, counting reward == 1 as correct by default", () => {
    // problem A: [1, 0, 0, 1, 0] -> pass@1 = 0.4; problem B: [0, 0] -> 0; mean 0.2
    expect(
      meanPassAtK(
        [
          [1, 0, 0, 1, 0],
          [0, 0],
        ],
        1,
      ),
    ).toBeCloseTo(0.2, 14);
    // with a threshold predicate: B counts 0.6 as correct -> pass@1 = 0.5; mean (0.4 + 0.5) / 2 = 0.45
    expect(
      meanPassAtK(
        [
          [1, 0, 0, 1, 0],
          [0.6, 0],
        ],
        1,
        (r) => r > 0.5,
      ),
    ).toBeCloseTo(0.45, 14);
  });
});
