import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createEmbeddedEngine, type EmbeddedEngine } from "../../src/engines/embedded/embedded-engine.ts";
import { createDemoTokenizer } from "../../src/model/tokenizer.ts";
import { assembleSample, type SegmentFact } from "../../src/core/sample.ts";
import { seedFrom } from "../../src/lib/hash.ts";
import { runCustomGenerate, type CustomGenerateBinding, type SegmentDraft } from "../../src/rollout/custom-generate.ts";
import { generate as toolAgent } from "../../examples/tool-agent/agent.ts";
import { calculate, trailingToolCall } from "../../examples/tool-agent/calculator.ts";

/**
 * The tool-using agent (examples/tool-agent) end to end on the embedded ONNX
 * engine with the demo checkpoint: no queue, no database. At temperature 2
 * the demo model writes `)` often enough that the calculator runs; every
 * sample's segments are checked for slime's invariants (loss_mask and
 * log-probs as long as the response, tool tokens masked with log-prob 0) and
 * every tool output for being the calculator's answer.
 */
const tok = createDemoTokenizer();
let engine: EmbeddedEngine;

beforeAll(async () => {
  engine = await createEmbeddedEngine({ checkpointUri: "examples/demo/warm-start" });
});
afterAll(async () => {
  await engine.close();
});

function bindingFor(
  prompt: string,
  sampleIndex: number,
  budget: number,
  prior: { tokens: number[]; segments: number } = { tokens: [], segments: 0 },
): CustomGenerateBinding {
  return {
    engine,
    args: { rollout_max_response_len: 16 },
    sample: {
      sampleIndex,
      groupId: 1,
      round: prior.segments,
      prompt,
      promptTokens: tok.formatPrompt(prompt),
      responseTokens: prior.tokens,
      response: tok.decode(prior.tokens),
      label: null,
      metadata: {},
      status: "pending",
    },
    sampling: { temperature: 2, topP: 1, topK: -1, stopTokenIds: [tok.eosId] },
    budget,
    firstSegmentIndex: prior.segments,
    requestIdFor: (seg) => `it-${prompt}-${sampleIndex}-${seg}`,
    seedFor: (seg) => seedFrom(42, prompt, sampleIndex, seg),
    fallbackWeightVersion: 0,
    tokenizer: { encode: (s) => tok.encode(s), decode: (ids) => tok.decode(ids) },
  };
}

/** slime's Sample invariants on the segments, plus: every tool run is the calculator's answer to the call before it. */
function checkSample(segments: SegmentDraft[], priorText = ""): { toolCalls: number } {
  let toolCalls = 0;
  let text = priorText;
  for (const s of segments) {
    expect(s.lossMask).toHaveLength(s.tokens.length);
    expect(s.logProbs).toHaveLength(s.tokens.length);
    expect(s.weightVersion).toBe(0);
    let i = 0;
    while (i < s.tokens.length) {
      if (s.lossMask[i] === 1) {
        expect(s.logProbs[i]).toBeLessThanOrEqual(0);
        text += tok.decode([s.tokens[i] as number]);
        i++;
        continue;
      }
      // A run of tool tokens: mask 0, log-prob 0, right after the model's `)`.
      let j = i;
      while (j < s.tokens.length && s.lossMask[j] === 0) {
        expect(s.logProbs[j]).toBe(0);
        j++;
      }
      const output = tok.decode(s.tokens.slice(i, j));
      expect(text.endsWith(")")).toBe(true);
      const expr = trailingToolCall(text);
      const value = expr === null ? null : calculate(expr);
      expect(output).toBe(`=${value === null ? "?" : value}`);
      text += output;
      toolCalls++;
      i = j;
    }
  }
  return { toolCalls };
}

const asFacts = (sampleIndex: number, segs: SegmentDraft[], round: number): SegmentFact[] => segs.map((s) => ({ ...s, sampleIndex, round }));

describe("tool-agent on the embedded engine", () => {
  it("runs multi-turn with the calculator; masks, log-probs and lengths stay consistent", async () => {
    let toolCalls = 0;
    let withTool = 0;
    for (const prompt of ["37+45=", "(3*4)+5=", "12*3=", "9+9="]) {
      for (let sampleIndex = 0; sampleIndex < 8; sampleIndex++) {
        const out = await runCustomGenerate(toolAgent, bindingFor(prompt, sampleIndex, 16));
        expect(out.segments.length).toBeGreaterThan(0);
        expect(["completed", "truncated"]).toContain(out.status);
        const n = checkSample(out.segments).toolCalls;
        toolCalls += n;
        if (n > 0) withTool++;
        // One segment per engine call: tool calls + 1 segments, unless the budget ran out right after a tool output.
        expect(out.segments.length === n + 1 || (out.segments.length === n && out.status === "truncated")).toBe(true);
        const sample = assembleSample(sampleIndex, asFacts(sampleIndex, out.segments, 0), null);
        expect(sample.responseTokens).toHaveLength(out.appendedTokens);
        expect(sample.responseTokens.length).toBeLessThanOrEqual(16);
        expect(sample.lossMask).toHaveLength(sample.responseTokens.length);
        expect(sample.tokenVersions.filter((v) => v === -1)).toHaveLength(sample.lossMask.filter((m) => m === 0).length);
        expect(sample.weightVersions).toEqual([0]);
        expect(sample.status).toBe(out.status);
      }
    }
    // Deterministic given the committed checkpoint and the seeds; the point is that the tool path ran.
    expect(withTool).toBeGreaterThan(0);
    expect(toolCalls).toBeGreaterThanOrEqual(withTool);
  });

  it("a sample cut by its budget resumes in the next round from its tokens", async () => {
    // Round 0 with a budget of 3, then round 1 with the rest of 16: the segments continue.
    const prompt = "(3*4)+5=";
    let resumedSome = false;
    for (let sampleIndex = 0; sampleIndex < 8; sampleIndex++) {
      const r0 = await runCustomGenerate(toolAgent, bindingFor(prompt, sampleIndex, 3));
      checkSample(r0.segments);
      if (r0.status !== "truncated") continue;
      resumedSome = true;
      const tokens0 = r0.segments.flatMap((s) => s.tokens);
      const r1 = await runCustomGenerate(toolAgent, bindingFor(prompt, sampleIndex, 16 - tokens0.length, { tokens: tokens0, segments: r0.segments.length }));
      expect(r1.segments[0]?.segmentIndex).toBe(r0.segments.length);
      checkSample(r1.segments, tok.decode(tokens0));
      const all = [...asFacts(sampleIndex, r0.segments, 0), ...asFacts(sampleIndex, r1.segments, 1)];
      const sample = assembleSample(sampleIndex, all, null);
      expect(sample.responseTokens).toEqual([...tokens0, ...r1.segments.flatMap((s) => s.tokens)]);
      expect(sample.lossMask).toHaveLength(sample.responseTokens.length);
      expect(sample.responseTokens.length).toBeLessThanOrEqual(16);
    }
    expect(resumedSome).toBe(true);
  });
});
