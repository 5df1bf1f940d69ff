import { describe, expect, it } from "vitest";
import { checkLogprobCompatibility, classifyProbe } from "./logprob-check.ts";
import { sampleToken, type LogprobMode } from "../../test/fakes/fake-lm.ts";

// The probe against the fake model in each of its log-prob modes: greedy (top_k = 1), T = 1 and 0.5.
function run(mode: LogprobMode, temperature: number) {
  const tokenIds: number[] = [];
  const logProbs: number[] = [];
  let prev = 8;
  for (let i = 0; i < 8; i++) {
    const t = sampleToken({ seed: 0, version: 0, position: 8 + i, prev, temperature, topP: 1, topK: 1, stopProb: 0.08, isEosAllowed: false, mode });
    tokenIds.push(t.token);
    logProbs.push(t.logProb);
    prev = t.token;
  }
  return { tokenIds, logProbs };
}

describe("log-prob probe", () => {
  it("recognises temperature-scaled log-probs before truncation (what rlq needs)", () => {
    const p = classifyProbe(run("scaled", 1), run("scaled", 0.5));
    expect(p).toMatchObject({ isTemperatureScaled: true, isBeforeTruncation: true });
    expect(() => checkLogprobCompatibility(p, { temperature: 0.7, topP: 0.9, topK: 20 }, "e")).not.toThrow();
  });

  it("recognises unscaled log-probs and refuses them unless T = 1", () => {
    const p = classifyProbe(run("original", 1), run("original", 0.5));
    expect(p).toMatchObject({ isTemperatureScaled: false, isBeforeTruncation: true });
    expect(() => checkLogprobCompatibility(p, { temperature: 0.7, topP: 1, topK: -1 }, "e")).toThrow(/before temperature scaling/);
    expect(() => checkLogprobCompatibility(p, { temperature: 1, topP: 0.9, topK: -1 }, "e")).not.toThrow();
  });

  it("recognises truncated log-probs and refuses them with top-p/top-k", () => {
    const p = classifyProbe(run("truncated", 1), run("truncated", 0.5));
    expect(p.isBeforeTruncation).toBe(false);
    expect(() => checkLogprobCompatibility(p, { temperature: 1, topP: 0.95, topK: -1 }, "e")).toThrow(/after top-p\/top-k truncation/);
    expect(() => checkLogprobCompatibility(p, { temperature: 1, topP: 1, topK: 50 }, "e")).toThrow(/truncation/);
    expect(() => checkLogprobCompatibility(p, { temperature: 1, topP: 1, topK: -1 }, "e")).not.toThrow();
  });

  it("says it cannot tell when every token is near-certain, and compares only aligned positions", () => {
    const certain = { tokenIds: [1, 2], logProbs: [-1e-5, -2e-5] };
    expect(classifyProbe(certain, certain)).toMatchObject({ isTemperatureScaled: null, isBeforeTruncation: null });
    const a = { tokenIds: [1, 2, 3], logProbs: [-1, -1, -1] };
    const b = { tokenIds: [1, 9, 9], logProbs: [-0.5, -5, -5] };
    expect(classifyProbe(a, b).isTemperatureScaled).toBe(true);
  });
});
