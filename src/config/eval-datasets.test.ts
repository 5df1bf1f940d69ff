import { describe, expect, it } from "vitest";
import { parseRunConfig } from "./run-config.ts";
import { evalSampleMetadata, resolveEvalDatasets } from "./eval-datasets.ts";

const base = {
  prompt_data: "/data/train.jsonl",
  rollout_batch_size: 4,
  n_samples_per_prompt: 2,
  num_rollout: 1,
  rm_type: "math",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
  rollout_temperature: 0.9,
  rollout_top_p: 0.95,
  rollout_max_response_len: 64,
};

describe("eval datasets", () => {
  it("resolve in slime's order: the dataset's own setting, then the eval_* key, then the rollout's", () => {
    const c = parseRunConfig({
      ...base,
      eval_temperature: 0.5,
      eval_input_key: "question",
      eval_tool_key: "functions",
      eval_max_prompt_len: 100,
      apply_chat_template_kwargs: { enable_thinking: false },
      eval_prompt_data: {
        plain: "/data/plain.jsonl",
        tuned: {
          path: "/data/tuned.parquet",
          input_key: "messages",
          label_key: null,
          temperature: 1.0,
          top_k: 20,
          max_response_len: 8,
          n_samples_per_eval_prompt: 4,
          rm_type: "f1",
          metadata_overrides: { split: "test" },
          apply_chat_template_kwargs: { enable_thinking: true },
        },
      },
      eval_pass_k: [1],
    });
    const [plain, tuned] = resolveEvalDatasets(c);
    expect(plain).toEqual({
      name: "plain",
      path: "/data/plain.jsonl",
      keys: { input_key: "question", label_key: "label", tool_key: "functions", metadata_key: "metadata" },
      rmType: null,
      metadataOverrides: {},
      n: 1,
      temperature: 0.5,
      topP: 0.95,
      topK: -1,
      maxResponseLen: 64,
      applyChatTemplate: false,
      chatTemplateKwargs: { enable_thinking: false },
      maxPromptLen: 100,
    });
    expect(tuned).toMatchObject({
      keys: { input_key: "messages", label_key: null, tool_key: "functions" },
      n: 4,
      temperature: 1.0,
      topK: 20,
      maxResponseLen: 8,
      rmType: "f1",
      chatTemplateKwargs: { enable_thinking: true },
    });
    // slime's inject_metadata: the dataset's rm_type, then its overrides, over the row's own.
    expect(evalSampleMetadata(tuned!, { rm_type: "math", split: "train", id: 7 })).toEqual({ rm_type: "f1", split: "test", id: 7 });
    expect(evalSampleMetadata(plain!, null)).toEqual({});
  });

  it("refuse what a dataset cannot mean, naming the dataset and the field", () => {
    expect(() => parseRunConfig({ ...base, eval_prompt_data: { x: { path: "/d.jsonl", stop: ["\n"] } } }, "cfg", "user")).toThrow(/eval_prompt_data\.x.*stop/s);
    expect(() => parseRunConfig({ ...base, eval_prompt_data: { x: { input_key: "q" } } }, "cfg", "user")).toThrow(/eval_prompt_data\.x\.path/);
    // pass@k against each dataset's own sample count.
    expect(() =>
      parseRunConfig(
        {
          ...base,
          n_samples_per_eval_prompt: 8,
          eval_pass_k: [1, 4],
          eval_prompt_data: { a: "/a.jsonl", b: { path: "/b.jsonl", n_samples_per_eval_prompt: 2 } },
        },
        "cfg",
        "user",
      ),
    ).toThrow(/pass@4 needs n_samples_per_eval_prompt >= 4 \(eval dataset b has 2\)/);
    expect(() => parseRunConfig({ ...base, eval_prompt_data: { x: { path: "/d.jsonl", apply_chat_template: true } } }, "cfg", "user")).toThrow(
      /eval_prompt_data\.x\.apply_chat_template.*needs hf_checkpoint/s,
    );
  });
});
