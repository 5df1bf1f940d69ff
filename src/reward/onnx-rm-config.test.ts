import { describe, expect, it } from "vitest";
import { parseRunConfig } from "../config/run-config.ts";
import { getRewardFunction } from "./registry.ts";

describe("rm_type onnx_rm in the run config", () => {
  const base = {
    prompt_data: "p.jsonl",
    rollout_batch_size: 1,
    n_samples_per_prompt: 2,
    num_rollout: 1,
    rollout_max_response_len: 8,
    ref_load: "examples/demo/warm-start",
  };

  it("needs rm_model_path, and says so", () => {
    expect(() => parseRunConfig({ ...base, rm_type: "onnx_rm" })).toThrow(/rm_model_path.*rm_type onnx_rm needs rm_model_path/s);
    expect(parseRunConfig({ ...base, rm_type: "onnx_rm", rm_model_path: "/models/rm" }).rm_model_path).toBe("/models/rm");
  });

  it("is not a per-sample function of the rule-based hub: asking the hub for it names where it is scored", () => {
    expect(() => getRewardFunction("onnx_rm")).toThrow(
      expect.objectContaining({ code: "rm_type_not_in_process", message: expect.stringMatching(/rm_model_path/) }),
    );
  });
});
