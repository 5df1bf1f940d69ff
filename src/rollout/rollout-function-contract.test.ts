import { describe, expect, it } from "vitest";
import { parseRunConfig } from "../config/run-config.ts";
import { deepFreeze, evalOutputSchema, loadRolloutFunction, trainOutputSchema } from "./rollout-function-contract.ts";

const base = {
  prompt_data: "data.jsonl",
  rollout_batch_size: 4,
  num_rollout: 1,
  rollout_max_response_len: 8,
  rm_type: "math",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
};

describe("rollout_function_path config", () => {
  it("accepts a module path", () => {
    expect(parseRunConfig({ ...base, rollout_function_path: "plugins/rollout.ts:rollout" }).rollout_function_path).toBe("plugins/rollout.ts:rollout");
  });

  it("refuses an HTTP URL, naming the key and saying what to do", () => {
    expect(() => parseRunConfig({ ...base, rollout_function_path: "http://127.0.0.1:8000/rollout" })).toThrow(
      /rollout_function_path = "http:\/\/127\.0\.0\.1:8000\/rollout": HTTP rollout functions are not supported.*name a TS\/JS module/,
    );
  });

  it("refuses train_async", () => {
    expect(() => parseRunConfig({ ...base, rollout_function_path: "r.ts", train_async: true })).toThrow(/cannot be combined with train_async/);
  });

  it("refuses an HTTP URL at load time too (a config stored before the check)", async () => {
    await expect(loadRolloutFunction("https://x/rollout", process.cwd())).rejects.toThrow(/HTTP rollout functions are not supported/);
  });
});

describe("rollout function outputs", () => {
  it("takes slime's {samples, metrics} or a bare list of groups", () => {
    const group = [{ groupId: 3, sampleIndex: 0, reward: 1, response: "x", extra: true }];
    expect(trainOutputSchema.parse({ samples: [group], metrics: { a: 1 } }).samples[0]?.[0]?.groupId).toBe(3);
    expect(trainOutputSchema.parse([group]).metrics).toBeUndefined();
    expect(trainOutputSchema.safeParse({ samples: [group], extra: 1 }).success).toBe(false);
    expect(trainOutputSchema.safeParse({ samples: [[{ sampleIndex: 0 }]] }).success).toBe(false);
  });

  it("eval outputs are per dataset {rewards, truncated, samples}", () => {
    const ok = { data: { d: { rewards: [1], truncated: [false], samples: [{ dataset: "d", promptIndex: 0, sampleIndex: 0 }] } } };
    expect(evalOutputSchema.safeParse(ok).success).toBe(true);
    expect(evalOutputSchema.safeParse({ data: { d: { rewards: [1], samples: [] } } }).success).toBe(false);
  });

  it("freezes what the function gets, so an edit throws instead of being ignored", () => {
    const s = deepFreeze({ reward: 1, tokens: [1, 2] });
    expect(() => {
      (s as { reward: number }).reward = 2;
    }).toThrow(TypeError);
    expect(() => s.tokens.push(3)).toThrow(TypeError);
  });
});
