/**
 * @file `rm_type: onnx_rm`: a learned reward model run in-process by onnxruntime-node, the one module of
 * reward/ that imports it (STYLE.md boundary). The model directory is what
 * workers/trainer-torch/rlq_torch/reward_model.py `export_onnx` writes (scripts/export-reward-model.py):
 *
 * - `reward_model.json`: `{format: "rlq-onnx-rm-v1", model, max_length, pad_token_id, inputs, output}`;
 * - `model.onnx`: (input_ids [B, T] int64, attention_mask [B, T] int64) -> scores [B] float32, the value head
 *   read at the last real token (right padding);
 * - `tokenizer.json` (+ tokenizer_config.json): the Hugging Face tokenizer the model was trained with.
 *
 * The scored text is `prompt + response`, encoded without special tokens and cut to the first `max_length`
 * tokens: what the Python side trains and exports on, so the two score the same ids.
 */

import { readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import * as ort from "onnxruntime-node";
import { z } from "zod";
import { loadHfTokenizer, type HfTokenizer } from "../engines/hf-tokenizer.ts";
import { RlqError } from "../lib/errors.ts";

const manifestSchema = z.object({
  format: z.literal("rlq-onnx-rm-v1"),
  model: z.string().min(1),
  max_length: z.number().int().positive(),
  pad_token_id: z.number().int().nonnegative(),
  inputs: z.tuple([z.literal("input_ids"), z.literal("attention_mask")]),
  output: z.string().min(1),
});

export const ONNX_RM_MANIFEST = "reward_model.json";

export interface OnnxRewardModelOptions {
  /** Texts per onnxruntime run; a group larger than this runs in several batches. Default 32. */
  batchSize?: number;
  /** Threads inside one run. Default 1 (the reward worker shares the machine with the rollout). */
  intraOpNumThreads?: number;
}

export interface OnnxRewardModel {
  readonly dir: string;
  /** Tokens scored per text at most (the manifest's max_length); longer texts keep their first maxLength tokens. */
  readonly maxLength: number;
  /** One score per text, in order. */
  scoreTexts(texts: readonly string[]): Promise<number[]>;
  /** One score per sample: the model's reward for `prompt + response`. */
  score(samples: readonly { prompt: string; response: string }[]): Promise<number[]>;
  close(): Promise<void>;
}

async function readManifest(dir: string): Promise<z.infer<typeof manifestSchema>> {
  const path = join(dir, ONNX_RM_MANIFEST);
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    const why = (e as NodeJS.ErrnoException).code === "ENOENT" ? "does not exist" : (e as Error).message;
    throw new RlqError(
      "model_invalid",
      `rm_model_path ${dir}: ${ONNX_RM_MANIFEST} ${why}; point rm_model_path at a directory written by scripts/export-reward-model.py`,
      { cause: e },
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new RlqError("model_invalid", `${path} is not valid JSON: ${(e as Error).message}`, { cause: e });
  }
  const parsed = manifestSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ");
    throw new RlqError(
      "model_invalid",
      `${path}: ${issues}; expected ${JSON.stringify({ format: "rlq-onnx-rm-v1", model: "model.onnx", max_length: 128, pad_token_id: 0, inputs: ["input_ids", "attention_mask"], output: "scores" })}`,
    );
  }
  return parsed.data;
}

async function createSession(path: string, threads: number): Promise<ort.InferenceSession> {
  try {
    await stat(path);
  } catch (e) {
    throw new RlqError("model_invalid", `reward model file ${path} does not exist (named by ${ONNX_RM_MANIFEST}'s "model")`, { cause: e });
  }
  try {
    return await ort.InferenceSession.create(path, {
      graphOptimizationLevel: "all",
      executionMode: "sequential",
      intraOpNumThreads: threads,
      interOpNumThreads: 1,
      logSeverityLevel: 3,
    });
  } catch (e) {
    throw new RlqError("model_invalid", `onnxruntime cannot load the reward model ${path}: ${(e as Error).message}`, { cause: e });
  }
}

/** Right-padded [rows, width] int64 ids and mask for one batch of token rows. */
function padBatch(rows: readonly number[][], padId: number): { ids: BigInt64Array; mask: BigInt64Array; width: number } {
  const width = Math.max(...rows.map((r) => r.length));
  const ids = new BigInt64Array(rows.length * width).fill(BigInt(padId));
  const mask = new BigInt64Array(rows.length * width);
  rows.forEach((r, i) => {
    for (let j = 0; j < r.length; j++) {
      ids[i * width + j] = BigInt(r[j] as number);
      mask[i * width + j] = 1n;
    }
  });
  return { ids, mask, width };
}

/**
 * Loads the reward model of `dir`. Throws RlqError `model_invalid` (not retried) naming the file when the
 * manifest, the ONNX file or its inputs/outputs are missing or wrong, and `tokenizer_missing`/`tokenizer_invalid`
 * for the tokenizer.
 */
export async function loadOnnxRewardModel(dir: string, options: OnnxRewardModelOptions = {}): Promise<OnnxRewardModel> {
  const manifest = await readManifest(dir);
  const tokenizer: HfTokenizer = await loadHfTokenizer(dir);
  const modelPath = join(dir, manifest.model);
  const session = await createSession(modelPath, options.intraOpNumThreads ?? 1);
  const missing = manifest.inputs.filter((n) => !session.inputNames.includes(n));
  if (missing.length > 0 || !session.outputNames.includes(manifest.output)) {
    await session.release();
    throw new RlqError(
      "model_invalid",
      `${modelPath}: the graph takes [${session.inputNames.join(", ")}] and gives [${session.outputNames.join(", ")}]; ${ONNX_RM_MANIFEST} expects inputs [${manifest.inputs.join(", ")}] and output "${manifest.output}"`,
    );
  }
  const batchSize = options.batchSize ?? 32;
  if (!Number.isInteger(batchSize) || batchSize < 1)
    throw new RlqError("config_invalid", `onnx reward model batchSize ${batchSize}: expected a positive integer`);

  async function runBatch(rows: readonly number[][]): Promise<number[]> {
    const { ids, mask, width } = padBatch(rows, manifest.pad_token_id);
    const dims = [rows.length, width];
    const out = await session.run({ input_ids: new ort.Tensor("int64", ids, dims), attention_mask: new ort.Tensor("int64", mask, dims) }, [manifest.output]);
    const t = out[manifest.output];
    // [B] float32; anything else (a [B, 1] head, logits over tokens) is a model this reader would misread.
    if (!t || t.type !== "float32" || t.dims.length !== 1 || t.dims[0] !== rows.length) {
      throw new RlqError(
        "model_invalid",
        `${modelPath}: output "${manifest.output}" is ${t ? `${t.type} [${t.dims.join(", ")}]` : "missing"}; expected float32 [${rows.length}] (one score per text)`,
      );
    }
    return Array.from(t.data as Float32Array);
  }

  async function scoreTexts(texts: readonly string[]): Promise<number[]> {
    const rows = texts.map((text, i) => {
      const r = tokenizer.encode(text).slice(0, manifest.max_length);
      if (r.length === 0) throw new RlqError("invalid_reward_input", `onnx_rm: text ${i} tokenises to no tokens; there is nothing to score`);
      return r;
    });
    const scores: number[] = [];
    for (let i = 0; i < rows.length; i += batchSize) scores.push(...(await runBatch(rows.slice(i, i + batchSize))));
    return scores;
  }

  return {
    dir,
    maxLength: manifest.max_length,
    scoreTexts,
    score: (samples) => scoreTexts(samples.map((s) => s.prompt + s.response)),
    close: () => session.release(),
  };
}
