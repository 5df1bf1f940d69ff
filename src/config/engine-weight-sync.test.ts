import { describe, expect, it } from "vitest";
import { ConfigError, parseRunConfig } from "./run-config.ts";

/** A run on a vLLM server (engine.kind openai) with the PyTorch trainer. */
const vllm = {
  prompt_data: "data/train.jsonl",
  rollout_batch_size: 4,
  n_samples_per_prompt: 2,
  rollout_max_response_len: 16,
  num_rollout: 2,
  rm_type: "math",
  engine: { kind: "openai", urls: ["http://127.0.0.1:8000"], model: "m" },
  trainer: { kind: "remote", url: "http://127.0.0.1:8700" },
  hf_checkpoint: "/models/m",
};
const refusal = (c: Record<string, unknown>): string => {
  try {
    parseRunConfig(c, "run.yaml", "user");
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as ConfigError).message;
  }
  throw new Error("expected a refusal");
};

describe("weight_sync with a vLLM engine", () => {
  it("weight_sync: none is accepted: the engines keep version 0", () => {
    expect(parseRunConfig({ ...vllm, weight_sync: "none" }, "run.yaml", "user").weight_sync).toBe("none");
  });

  it("disk (the default) is accepted: rlq loads each checkpoint through vLLM's RL endpoints", () => {
    expect(parseRunConfig(vllm, "run.yaml", "user").weight_sync).toBe("disk");
  });

  it("trainer_push is accepted: the trainer pushes through vLLM's weight transfer (gloo on CPU, nccl on GPUs)", () => {
    expect(parseRunConfig({ ...vllm, weight_sync: "trainer_push" }, "run.yaml", "user").weight_sync).toBe("trainer_push");
  });

  it("none is refused in async mode and with a staleness bound, saying why", () => {
    expect(refusal({ ...vllm, weight_sync: "none", train_async: true })).toMatch(/runs in sync mode only: set train_async: false/);
    expect(refusal({ ...vllm, weight_sync: "none", max_staleness: 2 })).toMatch(/step k trains on samples k versions stale.*leave max_staleness null/);
  });
});

describe("weight_update_mode in_place", () => {
  const sglang = { ...vllm, train_async: true, engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] } };

  it("is accepted for SGLang loading from disk: pause_generation in_place, then the load skips the model update lock", () => {
    expect(parseRunConfig({ ...sglang, weight_update_mode: "in_place" }, "run.yaml", "user").weight_update_mode).toBe("in_place");
  });

  it("is accepted for vLLM with weight_sync disk: the vLLM adapter pauses keeping its requests (engines/vllm-in-place.ts)", () => {
    const c = parseRunConfig({ ...vllm, train_async: true, weight_update_mode: "in_place" }, "run.yaml", "user");
    expect(c.weight_update_mode).toBe("in_place");
    expect(c.weight_sync).toBe("disk");
  });

  it("is refused where nothing loads in place, and with a custom generate, saying why", () => {
    expect(refusal({ ...vllm, weight_update_mode: "in_place", weight_sync: "none" })).toMatch(
      /weight_update_mode in_place with engine.kind openai: vLLM is loaded in place only with weight_sync disk .*with weight_sync none nothing is loaded; use weight_update_mode abort or drain/,
    );
    expect(refusal({ ...vllm, train_async: true, weight_update_mode: "in_place", custom_generate_function_path: "plugins/gen.ts:gen" })).toMatch(
      /weight_update_mode in_place with custom_generate_function_path: .*two versions; use weight_update_mode abort or drain/,
    );
    expect(refusal({ ...sglang, weight_update_mode: "in_place", custom_generate_function_path: "plugins/gen.ts:gen" })).toMatch(
      /weight_update_mode in_place with custom_generate_function_path/,
    );
    expect(refusal({ ...sglang, weight_update_mode: "in_place", weight_sync: "trainer_push" })).toMatch(/trainer push does not pause SGLang in place/);
  });
});

describe("weight_load_max_engines and group_extra_samples", () => {
  const sglang = { ...vllm, train_async: true, engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] } };

  it("staggered loads are accepted in place and refused otherwise, saying what to write", () => {
    expect(parseRunConfig({ ...sglang, weight_update_mode: "in_place", weight_load_max_engines: 2 }, "run.yaml", "user").weight_load_max_engines).toBe(2);
    expect(refusal({ ...sglang, weight_load_max_engines: 2 })).toMatch(
      /weight_load_max_engines 2 with weight_update_mode abort: .*set weight_update_mode: in_place or weight_load_max_engines: null/,
    );
    expect(refusal({ ...sglang, weight_update_mode: "in_place", weight_load_max_engines: 0 })).toMatch(/weight_load_max_engines/);
  });

  it("extra samples per group are accepted, and refused with a custom generate function", () => {
    expect(parseRunConfig({ ...sglang, group_extra_samples: 2 }, "run.yaml", "user").group_extra_samples).toBe(2);
    expect(refusal({ ...sglang, group_extra_samples: 2, custom_generate_function_path: "plugins/gen.ts:generate" })).toMatch(
      /group_extra_samples 2 with custom_generate_function_path: .*set group_extra_samples: 0/,
    );
    expect(refusal({ ...sglang, group_extra_samples: -1 })).toMatch(/group_extra_samples/);
  });
});
