/**
 * The same prompt with images on the rollout side (TypeScript) and in the torch trainer (Python): a dataset row with
 * multimodal_keys is rendered and tokenized by rlq's prompt builder (src/data/chat-template.ts, the tokenizer and
 * chat template of a tiny random Qwen2-VL written by scripts/make-tiny-vlm.py), written into an RLQB batch by the
 * train worker's encoder (images by reference, read and checked there), and decoded by the trainer, which expands
 * it with the model's processor (workers/trainer-torch/rlq_torch/vlm.py).
 *
 * Checked against Hugging Face's own processing of the row (the tokenizer's chat template over slime's content parts,
 * then the processor on the rendered text and the image files): the rollout's ids equal the template's ids with one
 * placeholder per image, and the trainer's input ids and pixel_values equal the processor's.
 */

import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { promptRowFromRecord } from "../../src/data/chat-template.ts";
import { loadHfTokenizer } from "../../src/engines/hf-tokenizer.ts";
import { encodeBatch } from "../../src/trainer/batch-codec.ts";
import type { TrainSample } from "../../src/trainer/trainer.ts";
import { solidPng } from "../helpers/png.ts";
import { repoRoot } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";

const python = requirePythonModules(["torch", "transformers", "PIL"]);

const REFERENCE = `
import io, json, os, sys
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "workers", "trainer-torch"))
from PIL import Image
from rlq_torch.batch import decode_batch
from rlq_torch.vlm import VisionInputs, load_processor

model, batch_path, rows_path, base = sys.argv[2:6]
proc = load_processor(model)
vision = VisionInputs(proc)
batch = decode_batch(open(batch_path, "rb").read())
rows = [json.loads(line) for line in open(rows_path)]
out = []
for i, (s, row) in enumerate(zip(batch.samples, rows)):
    x = vision.expand_sample(s, i)
    parts = [{"type": "text", "text": row["question"]}] + [{"type": "image"}] * len(row["images"])
    text = proc.tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True)
    images = [Image.open(os.path.join(base, p)).convert("RGB") for p in row["images"]]
    ref = proc(text=[text], images=images, return_tensors="pt")
    out.append({
        "rollout": s.tokens[: s.prompt_length].tolist(),
        "template": proc.tokenizer.encode(text, add_special_tokens=False),
        "trainer": x.tokens[: x.prompt_length].tolist(),
        "processor": ref["input_ids"][0].tolist(),
        "pixel_values_equal": bool(torch.equal(x.vision["pixel_values"], ref["pixel_values"])),
        "pixel_values_shape": list(x.vision["pixel_values"].shape),
        "grid": x.vision["image_grid_thw"].tolist(),
        "response": x.tokens[x.prompt_length :].tolist(),
    })
print(json.dumps(out))
`;

describe("a prompt with images: the rollout side and the torch trainer", () => {
  it("gives the same token ids and pixel_values as the model's Hugging Face processor", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-vlm-parity-"));
    const model = join(dir, "model");
    const made = spawnSync(python, [join(repoRoot, "scripts", "make-tiny-vlm.py"), model], { encoding: "utf8", timeout: 300_000 });
    expect(made.status, made.stderr).toBe(0);
    writeFileSync(join(dir, "red.png"), solidPng([200, 30, 30], 56, 56));
    writeFileSync(join(dir, "wide.png"), solidPng([30, 30, 200], 84, 56));
    const rows = [
      { question: "Which is larger?", images: ["red.png", "wide.png"] },
      { question: "How many squares?", images: ["wide.png"] },
    ];
    writeFileSync(join(dir, "rows.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n");

    const tok = await loadHfTokenizer(model);
    const options = { applyChatTemplate: true, chatTemplate: tok, multimodalKeys: { image: "images" }, imageBaseDir: dir, imageStoreDir: join(dir, "store") };
    const answer = [...tok.encode("red"), tok.eosId];
    const samples: TrainSample[] = rows.map((record, i) => {
      const row = promptRowFromRecord(record, i + 1, { input_key: "question", label_key: null, metadata_key: "metadata" }, options);
      if (!row.ok) throw new Error(row.error);
      const prompt = tok.encode(row.value.prompt);
      return {
        tokens: Int32Array.from([...prompt, ...answer]),
        promptLength: prompt.length,
        responseLength: answer.length,
        lossMask: new Uint8Array(answer.length).fill(1),
        rolloutLogProbs: new Float32Array(answer.length).fill(-1),
        tokenVersions: new Int32Array(answer.length),
        reward: 1,
        groupIndex: i,
        sampleIndex: 0,
        images: row.value.images ?? [],
      };
    });
    writeFileSync(join(dir, "batch.rlqb"), encodeBatch({ runId: "parity", step: 0, samples }));

    const r = spawnSync(python, ["-c", REFERENCE, repoRoot, model, join(dir, "batch.rlqb"), join(dir, "rows.jsonl"), dir], {
      encoding: "utf8",
      timeout: 300_000,
    });
    expect(r.status, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout.trim().split("\n").pop() as string) as Array<{
      rollout: number[];
      template: number[];
      trainer: number[];
      processor: number[];
      pixel_values_equal: boolean;
      pixel_values_shape: number[];
      grid: number[][];
      response: number[];
    }>;
    const pad = JSON.parse(readFileSync(join(model, "config.json"), "utf8")).image_token_id as number;
    expect(got).toHaveLength(2);
    for (const [i, g] of got.entries()) {
      // The rollout side's prompt is the template's, one placeholder per image.
      expect(g.rollout).toEqual(g.template);
      expect(g.rollout.filter((t) => t === pad)).toHaveLength(rows[i]!.images.length);
      // The trainer's ids and pixel_values are the processor's: each placeholder expanded to its merged patches.
      expect(g.trainer).toEqual(g.processor);
      expect(g.pixel_values_equal).toBe(true);
      expect(g.response).toEqual(answer);
    }
    // 56x56 px is 4x4 patches of 14 px (4 vision tokens after the 2x2 merge); 84x56 px is 4x6 (6 tokens).
    expect(got[0]!.grid).toEqual([
      [1, 4, 4],
      [1, 4, 6],
    ]);
    expect(got[0]!.trainer.filter((t) => t === pad)).toHaveLength(4 + 6);
    expect(got[1]!.grid).toEqual([[1, 4, 6]]);
    expect(got[1]!.pixel_values_shape[0]).toBe(24);
  });
});
