import { describe, expect, it } from "vitest";
import { ConfigError, parseRunConfig } from "./run-config.ts";
import { classifySlimeFlag } from "./slime-flags.ts";

const base = {
  prompt_data: "data/train.jsonl",
  rollout_batch_size: 4,
  n_samples_per_prompt: 2,
  rollout_max_response_len: 32,
  num_rollout: 2,
  rm_type: "math",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:8700" },
  hf_checkpoint: "/models/Qwen3-4B",
};
const user = (c: Record<string, unknown>) => parseRunConfig(c, "run.yaml", "user");
const refusal = (c: Record<string, unknown>): string => {
  try {
    user(c);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as ConfigError).message;
  }
  throw new Error("expected a refusal");
};

describe("tensor and context parallel keys (workers/trainer-torch/rlq_torch/tensor_parallel.py)", () => {
  it("default to 1 (not split) and keep what the run config says", () => {
    const c = user(base);
    expect([c.tensor_model_parallel_size, c.context_parallel_size, c.sequence_parallel]).toEqual([1, 1, false]);
    const s = user({ ...base, tensor_model_parallel_size: 2, context_parallel_size: 2, sequence_parallel: true });
    expect([s.tensor_model_parallel_size, s.context_parallel_size, s.sequence_parallel]).toEqual([2, 2, true]);
  });

  it("refuses sizes that are not positive integers, naming the key", () => {
    expect(refusal({ ...base, tensor_model_parallel_size: 0 })).toMatch(/tensor_model_parallel_size/);
    expect(refusal({ ...base, context_parallel_size: 1.5 })).toMatch(/context_parallel_size/);
    expect(refusal({ ...base, sequence_parallel: "yes" })).toMatch(/sequence_parallel/);
  });

  it("slime's --tensor-model-parallel-size and --context-parallel-size import as these keys; --sequence-parallel is dropped with why", () => {
    const keys = new Set(Object.keys(user(base)));
    expect(classifySlimeFlag("tensor_model_parallel_size", keys).kind).toBe("same");
    expect(classifySlimeFlag("context_parallel_size", keys).kind).toBe("same");
    const sp = classifySlimeFlag("sequence_parallel", keys);
    expect(sp.kind).toBe("dropped");
    expect(sp.kind === "dropped" && sp.note).toMatch(/RL step runs tensor_model_parallel_size without it/);
  });
});
