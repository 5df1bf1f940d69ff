import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { refuseTiedReload } from "./openai-compat.ts";

const dir = (config: Record<string, unknown> | null) => {
  const d = mkdtempSync(join(tmpdir(), "rlq-tied-"));
  if (config) writeFileSync(join(d, "config.json"), JSON.stringify(config));
  return d;
};

describe("weight_sync disk on vLLM refuses a model with a tied output layer", () => {
  it("tie_word_embeddings true (top level or a text_config) is refused, naming the key and the alternatives", async () => {
    for (const cfg of [
      { model_type: "qwen2", tie_word_embeddings: true },
      { model_type: "qwen2_vl", text_config: { tie_word_embeddings: true } },
    ]) {
      await expect(refuseTiedReload(dir(cfg), "run.yaml")).rejects.toMatchObject({
        code: "config_invalid",
        message: expect.stringMatching(
          /run.yaml: .*tie_word_embeddings: true.*Use an SGLang engine, or weight_sync: none, or a model with tie_word_embeddings: false/,
        ),
      });
    }
  });

  it("an untied model, a directory without config.json, and no model directory pass", async () => {
    await expect(refuseTiedReload(dir({ model_type: "qwen2", tie_word_embeddings: false }), "run.yaml")).resolves.toBeUndefined();
    await expect(refuseTiedReload(dir(null), "run.yaml")).resolves.toBeUndefined();
    await expect(refuseTiedReload(null, "run.yaml")).resolves.toBeUndefined();
  });
});
