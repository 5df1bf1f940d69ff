import { describe, expect, it } from "vitest";
import { applySglangMeta, readSglangAnswer } from "./sglang-answer.ts";
import { applyCompletionChoice } from "./openai-compat-choice.ts";
import { emptyPartial, parseWeightVersion } from "./remote.ts";

describe("SGLang /generate answers", () => {
  it("reads [logprob, id, text] tuples, the finish reason and the version", () => {
    const p = emptyPartial();
    const meta = readSglangAnswer(
      {
        text: "ab",
        meta_info: {
          id: "r",
          output_token_logprobs: [
            [-0.5, 97, "a"],
            [-1.25, 98, null],
          ],
          finish_reason: { type: "length", length: 2 },
          weight_version: "3",
          completion_tokens: 2,
        },
      },
      "t",
    );
    expect(applySglangMeta(p, meta, "t")).toBe("length");
    expect(p).toEqual({ tokenIds: [97, 98], logProbs: [-0.5, -1.25], weightVersion: 3 });
  });

  it("refuses a malformed answer, naming the field", () => {
    const where = "SGLang http://e/generate (rid x)";
    const ok = { output_token_logprobs: [[-0.5, 97]], finish_reason: null };
    expect(readSglangAnswer({ meta_info: ok }, where)).toEqual(ok);
    const cases: Array<[unknown, RegExp]> = [
      [null, /expected an object at \(answer\)/],
      [[], /expected an object at \(answer\)/],
      [{ text: "a" }, /expected an object at meta_info$/],
      [{ text: 3, meta_info: ok }, /expected a string at text$/],
      [{ meta_info: { ...ok, id: 5 } }, /at meta_info.id$/],
      [{ meta_info: { output_token_logprobs: {} } }, /expected an array at meta_info.output_token_logprobs$/],
      [{ meta_info: { output_token_logprobs: [[-1, 2], [-1]] } }, /expected \[logprob, token_id, \.\.\.\] at meta_info.output_token_logprobs.1$/],
      [{ meta_info: { output_token_logprobs: [["-1", 2]] } }, /expected a number at meta_info.output_token_logprobs.0.0$/],
      [{ meta_info: { output_token_logprobs: [[-1, 2.5]] } }, /non-negative integer token id at meta_info.output_token_logprobs.0.1$/],
      [{ meta_info: { output_token_logprobs: [[-1, -2]] } }, /non-negative integer token id at meta_info.output_token_logprobs.0.1$/],
      [{ meta_info: { finish_reason: "stop" } }, /expected null or \{type: string\} at meta_info.finish_reason$/],
      [{ meta_info: { weight_version: [] } }, /at meta_info.weight_version$/],
      [{ meta_info: { completion_tokens: -1 } }, /at meta_info.completion_tokens$/],
    ];
    for (const [payload, message] of cases) {
      expect(() => readSglangAnswer(payload, where), JSON.stringify(payload)).toThrow(message);
      try {
        readSglangAnswer(payload, where);
      } catch (e) {
        expect((e as Error).message.startsWith(`${where}: unexpected answer: `)).toBe(true);
        expect((e as { code?: string }).code).toBe("engine_bad_response");
      }
    }
  });

  it("replaces on cumulative stream events and appends on deltas", () => {
    const p = emptyPartial();
    expect(applySglangMeta(p, { output_token_logprobs: [[-1, 5]], finish_reason: null, completion_tokens: 1 }, "t")).toBeNull();
    applySglangMeta(
      p,
      {
        output_token_logprobs: [
          [-1, 5],
          [-2, 6],
        ],
        finish_reason: null,
        completion_tokens: 2,
      },
      "t",
    );
    expect(p.tokenIds).toEqual([5, 6]);
    // A server that streams deltas: completion_tokens counts all of them.
    applySglangMeta(p, { output_token_logprobs: [[-3, 7]], finish_reason: { type: "stop" }, completion_tokens: 3 }, "t");
    expect(p.tokenIds).toEqual([5, 6, 7]);
    expect(p.logProbs).toEqual([-1, -2, -3]);
  });

  it("keeps every token of an answer whose weight_versions spans tile it, and cuts one whose spans do not", () => {
    const out: Array<[number, number, null]> = [
      [-1, 5, null],
      [-2, 6, null],
      [-3, 7, null],
    ];
    const tiled = emptyPartial();
    const spans = [
      { weight_version: "2", start: 0, end: 2 },
      { weight_version: "3", start: 2, end: 3 },
    ];
    expect(applySglangMeta(tiled, { output_token_logprobs: out, finish_reason: { type: "length" }, weight_versions: spans, completion_tokens: 3 }, "t")).toBe(
      "length",
    );
    expect(tiled).toMatchObject({
      tokenIds: [5, 6, 7],
      weightVersion: 2,
      versionSpans: [
        { version: 2, start: 0, end: 2 },
        { version: 3, start: 2, end: 3 },
      ],
    });
    // Spans that leave a gap: only the first version's tokens are kept, as an abort at the cut.
    const gap = emptyPartial();
    const gapped = [
      { weight_version: "2", start: 0, end: 1 },
      { weight_version: "3", start: 2, end: 3 },
    ];
    expect(applySglangMeta(gap, { output_token_logprobs: out, finish_reason: { type: "length" }, weight_versions: gapped, completion_tokens: 3 }, "t")).toBe(
      "abort",
    );
    expect(gap).toMatchObject({ tokenIds: [5], weightVersion: 2, isVersionCut: true });
    expect(gap.versionSpans).toBeUndefined();
  });

  it("maps abort, clamps log-probs to <= 0 and rejects unknown finish reasons", () => {
    const p = emptyPartial();
    expect(applySglangMeta(p, { output_token_logprobs: [[1e-9, 1]], finish_reason: { type: "abort", message: "x" } }, "t")).toBe("abort");
    expect(p.logProbs).toEqual([0]);
    expect(() => applySglangMeta(emptyPartial(), { output_token_logprobs: [], finish_reason: { type: "weird" } }, "t")).toThrow(/unknown finish_reason/);
  });

  it("parses weight versions: SGLang's 'default' is version 0, junk is refused", () => {
    expect(parseWeightVersion("default", "t")).toBe(0);
    expect(parseWeightVersion("12", "t")).toBe(12);
    expect(parseWeightVersion(4, "t")).toBe(4);
    expect(() => parseWeightVersion("v1-abc", "t")).toThrow(/--weight-version/);
  });
});

describe("OpenAI-compatible completions", () => {
  it("takes token ids from token_ids, else from 'token_id:<id>' strings", () => {
    const p = emptyPartial();
    expect(
      applyCompletionChoice(p, { token_ids: [10, 11], logprobs: { tokens: ["a", "b"], token_logprobs: [-0.1, -0.2] }, finish_reason: null }, "t"),
    ).toBeNull();
    expect(applyCompletionChoice(p, { logprobs: { tokens: ["token_id:12"], token_logprobs: [-0.3] }, finish_reason: "stop" }, "t")).toBe("stop");
    expect(p.tokenIds).toEqual([10, 11, 12]);
    expect(p.logProbs).toEqual([-0.1, -0.2, -0.3]);
  });

  it("refuses text tokens without ids and missing log-probs", () => {
    expect(() => applyCompletionChoice(emptyPartial(), { logprobs: { tokens: ["hello"], token_logprobs: [-1] } }, "t")).toThrow(/return_tokens_as_token_ids/);
    expect(() => applyCompletionChoice(emptyPartial(), { token_ids: [1], logprobs: { tokens: ["x"], token_logprobs: [null] } }, "t")).toThrow(/no log-prob/);
    expect(applyCompletionChoice(emptyPartial(), { token_ids: [], logprobs: { tokens: [], token_logprobs: [] }, finish_reason: "length" }, "t")).toBe("length");
  });

  it("vLLM's finish reasons: repetition is a stop of its own; error is a retryable 500 after the tokens so far; anything else is a bad answer", () => {
    const p = emptyPartial();
    expect(applyCompletionChoice(p, { token_ids: [5], logprobs: { tokens: ["x"], token_logprobs: [-0.5] }, finish_reason: "repetition" }, "t")).toBe(
      "repetition",
    );
    expect(p.tokenIds).toEqual([5]);
    const q = emptyPartial();
    expect(() => applyCompletionChoice(q, { token_ids: [7], logprobs: { tokens: ["y"], token_logprobs: [-0.1] }, finish_reason: "error" }, "t")).toThrow(
      expect.objectContaining({ code: "engine_http_error", isRetriable: true, status: 500 }),
    );
    expect(q.tokenIds).toEqual([7]); // kept: the pool returns them as a resumable partial
    expect(() =>
      applyCompletionChoice(emptyPartial(), { token_ids: [], logprobs: { tokens: [], token_logprobs: [] }, finish_reason: "tool_calls" }, "t"),
    ).toThrow(expect.objectContaining({ code: "engine_bad_response" }));
  });
});
