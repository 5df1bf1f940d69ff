import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ModelConfig } from "../../model/config.ts";
import { Prng } from "../../model/prng.ts";
import { referenceResponseLogProbs } from "../../model/reference-forward.ts";
import { TINY_CONFIG } from "../../model/testing.ts";
import type { Weights } from "../../model/weights.ts";
import type { TrainRequest, TrainSample } from "../trainer.ts";

/**
 * Test fixtures for the embedded trainer: a synthetic GRPO batch whose
 * "engine" log-probs come from the float64 reference under `weights`.
 * Groups of random responses; reward 1 when the response contains token 7.
 */
export function makeSyntheticBatch(config: ModelConfig, weights: Weights, seed: number, numGroups = 4, groupSize = 4): TrainSample[] {
  const rng = new Prng(seed);
  const samples: TrainSample[] = [];
  for (let g = 0; g < numGroups; g++) {
    const prompt = [1, 3 + rng.nextInt(10), 13, 3 + rng.nextInt(10), 16];
    for (let i = 0; i < groupSize; i++) {
      const response = Array.from({ length: 3 + rng.nextInt(5) }, () => 3 + rng.nextInt(8));
      const tokens = [...prompt, ...response];
      // One masked token, so masking is exercised.
      const lossMask = Uint8Array.from(response, (_, t) => (t === 0 && i === 1 ? 0 : 1));
      samples.push({
        tokens: Int32Array.from(tokens),
        promptLength: prompt.length,
        responseLength: response.length,
        lossMask,
        rolloutLogProbs: Float32Array.from(referenceResponseLogProbs(config, weights, tokens, prompt.length)),
        tokenVersions: new Int32Array(response.length),
        reward: response.includes(7) ? 1 : 0,
        groupIndex: g,
        sampleIndex: i,
      });
    }
  }
  return samples;
}

/** A step-0 request over a synthetic batch, starting from `refDir` (ref_load), output in a fresh temp dir. */
export async function makeTrainRequest(
  weights: Weights,
  refDir: string,
  overrides: Partial<TrainRequest> & { config?: Record<string, unknown> } = {},
): Promise<TrainRequest> {
  return {
    runId: "run-a",
    step: 0,
    attempt: 1,
    weightVersionIn: 0,
    checkpointUriIn: null,
    outputDir: await mkdtemp(join(tmpdir(), "rlq-train-")),
    batch: { runId: "run-a", step: 0, samples: makeSyntheticBatch(TINY_CONFIG, weights, 1) },
    ...overrides,
    config: { lr: 1e-2, num_steps_per_rollout: 2, ref_load: refDir, use_tis: true, ...overrides.config },
  };
}
