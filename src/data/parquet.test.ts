import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadHfTokenizer } from "../engines/hf-tokenizer.ts";
import { sha256Hex } from "../lib/hash.ts";
import { filterLongPrompts, promptRowFromRecord, renderPromptInput } from "./chat-template.ts";
import { isParquetPath, loadParquetDataset } from "./parquet.ts";
import { chatTokenizerDir } from "../../test/helpers/chat-tokenizer.ts";

// Built by scripts/build-data-fixtures.ts and committed.
const FIXTURES = join(import.meta.dirname, "..", "..", "test", "fixtures", "data");
const keys = { input_key: "input", label_key: "label", metadata_key: "metadata" };

describe("Parquet prompt datasets", () => {
  it("loads the good rows, reports the bad ones by row number, fingerprints the file", async () => {
    const path = join(FIXTURES, "prompts.parquet");
    const ds = await loadParquetDataset(path, keys);
    expect(ds.rows.map((r) => r.prompt)).toEqual(["1+2=", "30+4=", "7+7=", "12+30+45+9="]);
    expect(ds.rows.map((r) => r.index)).toEqual([0, 1, 2, 3]);
    expect(ds.rows.map((r) => r.line)).toEqual([1, 2, 4, 6]);
    // INT64 labels arrive as bigint and are stored as their JSON, like a numeric JSONL label.
    expect(ds.rows.map((r) => r.label)).toEqual(["3", "34", "14", "96"]);
    expect(ds.rows[2]?.metadata).toEqual({ rm_type: "f1" });
    expect(ds.errors).toHaveLength(2);
    expect(ds.errors[0]).toContain("#row 3: input_key 'input' must be a non-empty string");
    expect(ds.errors[1]).toContain("#row 5:");
    expect(ds.fingerprint).toBe(sha256Hex(readFileSync(path)));
    expect(isParquetPath(path)).toBe(true);
    expect(isParquetPath("x.jsonl")).toBe(false);
  });

  it("fails the load on a bad row when configured so", async () => {
    await expect(loadParquetDataset(join(FIXTURES, "prompts.parquet"), keys, { isBadRowFatal: true })).rejects.toMatchObject({
      code: "dataset_bad_row",
      message: expect.stringContaining("#row 3"),
    });
  });

  it("names a missing input column and an unreadable file", async () => {
    await expect(loadParquetDataset(join(FIXTURES, "prompts.parquet"), { ...keys, input_key: "question" })).rejects.toMatchObject({
      code: "dataset_invalid",
      message: expect.stringContaining("no column input_key 'question' (columns: input, label, metadata)"),
    });
    const junk = join(mkdtempSync(join(tmpdir(), "rlq-pq-")), "junk.parquet");
    writeFileSync(junk, "not parquet at all");
    await expect(loadParquetDataset(junk, keys)).rejects.toMatchObject({ code: "dataset_invalid" });
    await expect(loadParquetDataset(join(FIXTURES, "nope.parquet"), keys)).rejects.toMatchObject({ code: "dataset_missing" });
  });

  it("renders message lists with the tokenizer's chat template (apply_chat_template)", async () => {
    const tok = await loadHfTokenizer(chatTokenizerDir());
    const ds = await loadParquetDataset(
      join(FIXTURES, "chat.parquet"),
      { ...keys, input_key: "messages", tool_key: "tools" },
      { applyChatTemplate: true, chatTemplate: tok },
    );
    expect(ds.rows[0]?.prompt).toBe("TOOLS:1\n<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n");
    expect(ds.rows[1]?.prompt).toBe("<|im_start|>user\n5+5=<|im_end|>\n<|im_start|>assistant\n");
    expect(ds.rows).toHaveLength(3);
    expect(ds.errors).toEqual([
      expect.stringContaining("#row 4: input_key 'messages' must be a string or a non-empty list of {role, content} messages (0.content:"),
    ]);
  });

  it("without apply_chat_template a message list is a row error that says what to set", async () => {
    await expect(loadParquetDataset(join(FIXTURES, "chat.parquet"), { ...keys, input_key: "messages" })).rejects.toMatchObject({
      code: "dataset_empty",
      message: expect.stringContaining("set apply_chat_template: true"),
    });
  });
});

describe("prompt records and the chat template", () => {
  it("wraps a string prompt as one user message and passes apply_chat_template_kwargs", async () => {
    const tok = await loadHfTokenizer(chatTokenizerDir());
    const out = renderPromptInput("2+2=", undefined, keys, { applyChatTemplate: true, chatTemplate: tok, chatTemplateKwargs: { enable_thinking: false } });
    expect(out).toEqual({ ok: true, value: "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n<think></think>" });
  });

  it("a missing template is a config error, not a row error", () => {
    expect(() => renderPromptInput("x", undefined, keys, { applyChatTemplate: true })).toThrow(/hf_checkpoint/);
  });

  it("reads metadata given as a JSON string and rejects bad tools", async () => {
    const tok = await loadHfTokenizer(chatTokenizerDir());
    const ok = promptRowFromRecord({ input: "1+1=", label: 2, metadata: '{"rm_type":"math"}' }, 7, keys);
    expect(ok).toEqual({ ok: true, value: { line: 7, prompt: "1+1=", label: "2", metadata: { rm_type: "math" } } });
    const bad = promptRowFromRecord({ input: "1+1=", tools: "{nope" }, 8, { ...keys, tool_key: "tools" }, { applyChatTemplate: true, chatTemplate: tok });
    expect(bad).toEqual({ ok: false, error: "tool_key 'tools' is a string that is not JSON: \"{nope\"" });
    expect(promptRowFromRecord({ input: "1", metadata: [1] }, 9, keys)).toMatchObject({
      ok: false,
      error: expect.stringContaining("metadata_key 'metadata' must be an object"),
    });
  });
});

describe("rollout_max_prompt_len", () => {
  it("drops prompts longer than the limit, re-indexes, and counts them", async () => {
    const ds = await loadParquetDataset(join(FIXTURES, "prompts.parquet"), keys);
    const { dataset, report } = filterLongPrompts(ds, (p) => p.length + 1, 6); // +1: a BOS, as the demo tokenizer adds
    expect(dataset.rows.map((r) => [r.index, r.prompt])).toEqual([
      [0, "1+2="],
      [1, "30+4="],
      [2, "7+7="],
    ]);
    expect(report).toEqual({ maxPromptLen: 6, filtered: 1, examples: [{ line: 6, tokens: 12 }] });
    expect(dataset.fingerprint).toBe(ds.fingerprint);
    expect(filterLongPrompts(ds, (p) => p.length, null)).toEqual({ dataset: ds, report: null });
    expect(() => filterLongPrompts(ds, () => 100, 6)).toThrow(/every one of 4 prompts is longer than rollout_max_prompt_len 6/);
  });
});
