import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeCheckpoint } from "./checkpoint.ts";
import { parseModelConfig, type ModelConfig } from "./config.ts";
import { initWeights, type Weights } from "./weights.ts";

/**
 * Helpers for unit tests of the model, engine and trainer (not used in production
 * paths). Random-init weights give near-uniform logits, which would make the
 * numeric checks vacuous, so tests scale them up to get peaked distributions.
 */
export const TINY_CONFIG: ModelConfig = parseModelConfig({
  vocab_size: 24,
  context_length: 32,
  d_model: 32,
  n_heads: 4,
  n_layers: 2,
  d_mlp: 64,
});

/** initWeights with every non-LayerNorm tensor multiplied by `scale`. */
export function scaledWeights(config: ModelConfig, seed: number, scale: number): Weights {
  const w = initWeights(config, seed);
  for (const [name, data] of Object.entries(w)) {
    if (name.includes("ln")) continue;
    for (let i = 0; i < data.length; i++) data[i] = (data[i] as number) * scale;
  }
  return w;
}

/** Write a checkpoint into a fresh temp dir; returns the checkpoint directory. */
export async function writeTestCheckpoint(config: ModelConfig, weights: Weights, version = 0): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "rlq-model-"));
  await writeCheckpoint(dir, { config, weights, version, runId: "test", step: -1 });
  return dir;
}
