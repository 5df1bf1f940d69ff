import { describe, expect, it } from "vitest";
import { parseRunConfig } from "./run-config.ts";
import { isSftRun } from "./sft-keys.ts";

const sft = {
  prompt_data: "d.jsonl",
  label_key: "response",
  loss_type: "sft_loss",
  rollout_batch_size: 4,
  rollout_max_response_len: 32,
  num_epoch: 2,
  rm_type: "math",
  ref_load: "ckpt",
  trainer: { kind: "remote", url: "http://127.0.0.1:8700" },
};

describe("loss_type sft_loss (SFT as a run mode)", () => {
  it("parses, and policy_loss stays the default", () => {
    expect(isSftRun(parseRunConfig(sft, "run.yaml", "user"))).toBe(true);
    const { loss_type: _, ...rl } = sft;
    expect(parseRunConfig(rl, "run.yaml", "user").loss_type).toBe("policy_loss");
  });

  it.each([
    ["label_key", { label_key: null }, "label_key: set label_key to the field holding it"],
    ["n_samples_per_prompt", { n_samples_per_prompt: 4 }, "set n_samples_per_prompt: 1 (got 4)"],
    ["train_async", { train_async: true }, "set train_async: false"],
    ["partial_rollout", { partial_rollout: true }, "set partial_rollout: false"],
    ["rollout_function_path", { rollout_function_path: "x.ts:rollout" }, "remove rollout_function_path"],
    ["custom_generate_function_path", { custom_generate_function_path: "x.ts:gen" }, "remove custom_generate_function_path"],
    ["dynamic_sampling_filter_path", { dynamic_sampling_filter_path: "check_reward_nonzero_std" }, "remove dynamic_sampling_filter_path"],
    ["eval_label_key", { eval_prompt_data: { heldout: "e.jsonl" } }, "set eval_label_key (or the dataset's label_key) to the eval rows' answer field"],
    ["eval_label_key", { eval_prompt_data: { a: { path: "a.jsonl", label_key: "label" }, b: "b.jsonl" } }, "the evals (b) would grade against"],
    ["over_sampling_batch_size", { over_sampling_batch_size: 8 }, "leave over_sampling_batch_size out (got 8, rollout_batch_size 4)"],
  ])("refuses %s, naming what to write instead", (key, change, message) => {
    expect(() => parseRunConfig({ ...sft, ...change }, "run.yaml", "user")).toThrow(message);
    expect(() => parseRunConfig({ ...sft, ...change }, "run.yaml", "user")).toThrow(key);
  });

  it("refuses an unknown loss_type", () => {
    expect(() => parseRunConfig({ ...sft, loss_type: "custom_loss" }, "run.yaml", "user")).toThrow("loss_type");
  });
});
