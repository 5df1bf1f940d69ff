import { describe, expect, it } from "vitest";
import { ConfigError, parseRunConfig } from "./run-config.ts";
import { checkTrainerCapabilities, requiredCapabilities } from "../trainer/capabilities.ts";

/** The LoRA keys (trainer-torch-keys.ts; workers/trainer-torch/rlq_torch/lora.py reads them). */
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

describe("LoRA keys", () => {
  it("default to off (lora_rank 0, the rest null) and keep what the run config says", () => {
    const c = user(base);
    expect([c.lora_rank, c.lora_alpha, c.lora_dropout, c.target_modules]).toEqual([0, null, null, null]);
    const l = user({ ...base, lora_rank: 8, lora_alpha: 32, lora_dropout: 0.05, target_modules: ["q_proj", "v_proj"] });
    expect([l.lora_rank, l.lora_alpha, l.lora_dropout, l.target_modules]).toEqual([8, 32, 0.05, ["q_proj", "v_proj"]]);
    expect(user({ ...base, lora_rank: 8, target_modules: "all-linear" }).target_modules).toBe("all-linear");
  });

  it("refuses bad values and combinations, naming the key and what to write", () => {
    expect(refusal({ ...base, lora_rank: -1 })).toMatch(/lora_rank/);
    expect(refusal({ ...base, lora_rank: 8, lora_alpha: 0 })).toMatch(/lora_alpha/);
    expect(refusal({ ...base, lora_rank: 8, lora_dropout: 1 })).toMatch(/lora_dropout/);
    expect(refusal({ ...base, lora_rank: 8, target_modules: [] })).toMatch(/target_modules/);
    expect(refusal({ ...base, lora_rank: 8, target_modules: "q_proj" })).toMatch(/target_modules/);
    expect(refusal({ ...base, lora_alpha: 16 })).toMatch(/lora_alpha is set but lora_rank is 0.*set lora_rank/);
    expect(refusal({ ...base, lora_rank: 8, hf_checkpoint: null })).toMatch(/lora_rank needs a Hugging Face model \(hf_checkpoint\)/);
    expect(refusal({ ...base, lora_rank: 8, tensor_model_parallel_size: 2 })).toMatch(/tensor_model_parallel_size > 1/);
    expect(refusal({ ...base, lora_rank: 8, trainer: { kind: "embedded" } })).toMatch(/lora_rank needs the torch trainer/);
  });

  it("lora_sync: merged by default; adapter only for a LoRA run with a disk sync to vLLM", () => {
    const vllm = { kind: "openai", urls: ["http://127.0.0.1:8000"], model: "m" };
    expect(user({ ...base, lora_rank: 8 }).lora_sync).toBe("merged");
    expect(user({ ...base, lora_rank: 8, engine: vllm, lora_sync: "adapter" }).lora_sync).toBe("adapter");
    expect(refusal({ ...base, lora_rank: 8, engine: vllm, lora_sync: "delta" })).toMatch(/lora_sync/);
    expect(refusal({ ...base, engine: vllm, lora_sync: "adapter" })).toMatch(/lora_sync: adapter needs a LoRA run: set lora_rank/);
    expect(refusal({ ...base, lora_rank: 8, engine: vllm, lora_sync: "adapter", weight_sync: "none" })).toMatch(
      /lora_sync: adapter with weight_sync: none: .*set weight_sync: disk or lora_sync: merged/,
    );
    expect(refusal({ ...base, lora_rank: 8, lora_sync: "adapter" })).toMatch(
      /lora_sync: adapter with engine.kind sglang: rlq's SGLang adapter does not load LoRA adapters/,
    );
  });

  it("needs a trainer that declares capabilities.lora", () => {
    expect(requiredCapabilities({ lora_rank: 0 })).toEqual([]);
    expect(requiredCapabilities({ lora_rank: 8, advantage_estimator: "ppo" })).toEqual(["critic", "lora"]);
    expect(() => checkTrainerCapabilities({ capabilities: { critic: true } }, { lora_rank: 8 }, "x")).toThrow(/capabilities\.lora/);
    expect(() => checkTrainerCapabilities({ capabilities: { lora: true } }, { lora_rank: 8 }, "x")).not.toThrow();
  });
});
