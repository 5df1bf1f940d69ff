import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseRunConfig } from "../config/run-config.ts";
import { resolveEvalDatasets } from "../config/eval-datasets.ts";
import { loadEvalDataset, loadRunDataset, tokenizerFor } from "./plugins-registry.ts";
import { chatTokenizerDir } from "../../test/helpers/chat-tokenizer.ts";

const FIXTURES = join(import.meta.dirname, "..", "..", "test", "fixtures", "data");

/** Message-list rows (with tools on one), as a chat dataset holds them. */
function chatRows(dir: string): string {
  const path = join(dir, "chat.jsonl");
  const rows = [
    {
      messages: [
        { role: "system", content: "Add." },
        { role: "user", content: "1+2=" },
      ],
      tools: [{ name: "calc" }],
      label: "3",
    },
    { messages: [{ role: "user", content: "5+5=" }], label: "10" },
    { messages: [{ role: "user", content: "12+30+45+9+100+200=" }], label: "396" },
  ];
  writeFileSync(path, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
  return path;
}

/** A run whose prompts are `rows` as message lists, rendered by the chat template with kwargs. */
const chatRunConfig = (rows: string) => ({
  prompt_data: rows,
  input_key: "messages",
  apply_chat_template: true,
  apply_chat_template_kwargs: { enable_thinking: false },
  tokenizer: "hf",
  hf_checkpoint: chatTokenizerDir(),
  rollout_batch_size: 1,
  n_samples_per_prompt: 1,
  num_rollout: 1,
  rollout_max_response_len: 16,
  rm_type: "math",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
});

describe("evals through the rollout's prompt pipeline", () => {
  it("an eval set of message lists gets the same prompt tokens as the rollout path for the same rows (chat template, kwargs, tools)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-eval-ds-"));
    const rows = chatRows(dir);
    const c = parseRunConfig({
      ...chatRunConfig(rows),
      eval_prompt_data: { same: rows },
    });
    const tokenizer = await tokenizerFor(c);
    const rollout = (await loadRunDataset(c, tokenizer)).dataset;
    const [d] = resolveEvalDatasets(c);
    const evalSet = (await loadEvalDataset(c, d!, tokenizer)).dataset;
    expect(evalSet.rows).toHaveLength(3);
    expect(evalSet.rows.map((r) => tokenizer.encode(r.prompt))).toEqual(rollout.rows.map((r) => tokenizer.encode(r.prompt)));
    expect(evalSet.rows.map((r) => r.label)).toEqual(rollout.rows.map((r) => r.label));
    // The template ran (tools and the run's kwargs included), not a flattening of the messages.
    expect(evalSet.rows[0]?.prompt).toBe(
      "TOOLS:1\n<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n<think></think>",
    );
  });

  it("a dataset's own settings apply to it alone: its keys, its template kwargs, Parquet, and eval_max_prompt_len", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-eval-ds-"));
    const rows = chatRows(dir);
    const c = parseRunConfig({
      ...chatRunConfig(rows),
      eval_max_prompt_len: 30,
      eval_prompt_data: {
        thinking: { path: rows, apply_chat_template_kwargs: { enable_thinking: true } },
        parquet: { path: join(FIXTURES, "chat.parquet"), input_key: "messages", tool_key: "tools" },
      },
    });
    const tokenizer = await tokenizerFor(c);
    const [thinking, parquet] = resolveEvalDatasets(c);
    const t = await loadEvalDataset(c, thinking!, tokenizer);
    // enable_thinking: true renders no empty think block; the rows over 30 tokens are left out, and counted.
    expect(t.dataset.rows.map((r) => r.prompt)).toEqual(["<|im_start|>user\n5+5=<|im_end|>\n<|im_start|>assistant\n"]);
    expect(t.report).toMatchObject({ maxPromptLen: 30, filtered: 2 });
    // Every Parquet row is over the bound: the error names the eval dataset and the eval key.
    await expect(loadEvalDataset(c, parquet!, tokenizer)).rejects.toThrow(
      /eval_prompt_data\.parquet .*chat\.parquet: every one of 3 prompts is longer than eval_max_prompt_len 30/,
    );
    const p = await loadEvalDataset(c, { ...parquet!, maxPromptLen: null }, tokenizer);
    expect(p.dataset.rows[1]?.prompt).toBe("<|im_start|>user\n5+5=<|im_end|>\n<|im_start|>assistant\n<think></think>");
  });
});
