import { describe, expect, it } from "vitest";
import { Prng } from "../../model/prng.ts";
import { logitNoise, sampleToken } from "./sampler.ts";

const plain = { temperature: 1, topP: 1, topK: -1 };

describe("injected logit noise (engine.logit_noise_std)", () => {
  it("samples from and reports the log-prob of the perturbed distribution", () => {
    // logits [0, 0] + noise [ln 3, 0] → p = [3/4, 1/4]; the clean distribution would be [1/2, 1/2].
    const noise = [Math.log(3), 0];
    const a = sampleToken([0, 0], plain, 0.7, noise);
    expect(a.token).toBe(0);
    expect(a.logProb).toBeCloseTo(Math.log(0.75), 12);
    const b = sampleToken([0, 0], plain, 0.8, noise); // past the 3/4 boundary
    expect(b.token).toBe(1);
    expect(b.logProb).toBeCloseTo(Math.log(0.25), 12);
    // Without noise the same uniform picks token 1 of [1/2, 1/2].
    expect(sampleToken([0, 0], plain, 0.7)).toEqual({ token: 1, logProb: Math.log(0.5) });
    // Temperature divides logits and noise alike: (0 + ln 3)/2 vs 0 → p0 = √3/(√3 + 1).
    expect(sampleToken([0, 0], { ...plain, temperature: 2 }, 0.1, noise).logProb).toBeCloseTo(Math.log(Math.sqrt(3) / (Math.sqrt(3) + 1)), 12);
  });

  it("samples a row at an offset into a batch's logits as it samples that row alone", () => {
    const rows = [
      [0.5, -1, 2, 0.25],
      [3, 1, -2, 0],
      [-0.5, 0.5, 1.5, 1],
    ];
    const batch = Float32Array.from(rows.flat());
    for (const config of [plain, { temperature: 0.7, topP: 0.8, topK: 3 }]) {
      rows.forEach((row, i) => {
        for (const u of [0.05, 0.5, 0.93]) {
          expect(sampleToken(batch, config, u, undefined, i * 4, 4)).toEqual(sampleToken(Float32Array.from(row), config, u));
        }
      });
    }
    expect(() => sampleToken(batch, plain, 0.5, undefined, 10, 4)).toThrow(/outside 12 logits/);
  });

  it("is off at std 0 and a function of the stream, scaled by std", () => {
    expect(logitNoise(null, 4, 1)).toBeUndefined();
    expect(logitNoise(new Prng(7), 4, 0)).toBeUndefined();
    const one = logitNoise(new Prng(7), 4, 1) as Float64Array;
    const again = logitNoise(new Prng(7), 4, 1) as Float64Array;
    const two = logitNoise(new Prng(7), 4, 2) as Float64Array;
    expect(Array.from(again)).toEqual(Array.from(one));
    expect(Array.from(two)).toEqual(Array.from(one, (v) => 2 * v));
    expect(one.some((v) => v !== 0)).toBe(true);
  });
});
