import { describe, expect, it } from "vitest";
import { EOS, VOCAB, instantToken } from "./fake-lm.ts";

describe("the fake engine's instant model (benches)", () => {
  const at = (position: number, prev: number, isEosAllowed = true, stopProb = 0.1) =>
    instantToken({ seed: 7, version: 2, position, prev, stopProb, isEosAllowed });

  it("is a pure function of (seed, version, position, previous token)", () => {
    expect(at(10, 65)).toEqual(at(10, 65));
    const draws = Array.from({ length: 200 }, (_, i) => at(i, 65).token);
    expect(new Set(draws).size).toBeGreaterThan(20);
  });

  it("draws EOS with probability stop_prob where allowed, never where not, and reports the draw's log-prob", () => {
    const n = 20_000;
    let stops = 0;
    for (let i = 0; i < n; i++) {
      const t = at(i, 40 + (i % 50));
      expect(VOCAB).toContain(t.token);
      if (t.token === EOS) {
        stops++;
        expect(t.logProb).toBeCloseTo(Math.log(0.1), 12);
      }
      expect(at(i, 40 + (i % 50), false).token).not.toBe(EOS);
    }
    expect(stops / n).toBeGreaterThan(0.09);
    expect(stops / n).toBeLessThan(0.11);
    // The reported log-probs are those of one distribution over the vocabulary.
    const pEos = Math.exp(instantToken({ seed: 0, version: 0, position: 0, prev: 0, stopProb: 1, isEosAllowed: true }).logProb);
    expect(pEos).toBeCloseTo(1, 12);
    const other = [...Array(500).keys()].map((i) => at(i, 33)).find((t) => t.token !== EOS);
    expect(0.1 + (VOCAB.length - 1) * Math.exp(other?.logProb ?? 0)).toBeCloseTo(1, 12);
  });
});
