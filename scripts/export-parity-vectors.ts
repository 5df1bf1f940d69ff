/**
 * Dumps rlq's parity vectors (src/algorithms/parity-vectors.ts) for a few seeds to
 * workers/trainer-torch/parity-vectors.json, the file the PyTorch trainer's parity
 * test (workers/trainer-torch/tests/test_parity.py) checks its port against.
 *
 *   npx tsx scripts/export-parity-vectors.ts [--check]
 *
 * Deterministic: the same code gives a byte-identical file (no timestamps).
 * --check exits 1 when the committed file differs from what the code produces
 * (the TypeScript math changed and the vectors must be re-exported).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { makeParityVectors, PARITY_DEFAULT_SEED, PARITY_VECTORS_VERSION } from "../src/algorithms/parity-vectors.ts";
import { parseModelConfig } from "../src/model/config.ts";
import { referenceResponseLogProbs } from "../src/model/reference-forward.ts";
import { initWeights } from "../src/model/weights.ts";

const PARITY_SEEDS = [PARITY_DEFAULT_SEED, 1, 7, 20251121] as const;
const out = fileURLToPath(new URL("../workers/trainer-torch/parity-vectors.json", import.meta.url));

/**
 * The embedded model's float64 reference forward (src/model/reference-forward.ts) on
 * initWeights(config, seed): the PyTorch port must initialise the same weights and
 * compute the same response log-probs.
 */
function modelCases(): unknown {
  const config = parseModelConfig({ vocab_size: 258, context_length: 64, d_model: 32, n_heads: 4, n_layers: 2, d_mlp: 64 });
  const seed = 1234;
  const weights = initWeights(config, seed);
  const sequences = [
    { tokens: [256, 72, 105, 33, 32, 50, 43, 50, 61, 52, 257], promptLength: 4 },
    { tokens: [256, 81, 48, 58, 32, 48, 32, 43, 32, 48, 32, 61, 48], promptLength: 11 },
    { tokens: [1, 2, 3], promptLength: 1 },
  ];
  const temperature = 0.7;
  return {
    config,
    seed,
    temperature,
    // A few initial values of each tensor, to pin the initialisation itself.
    init: Object.fromEntries(Object.entries(weights).map(([k, v]) => [k, Array.from(v.subarray(0, 4))])),
    cases: sequences.map((s) => ({ ...s, logProbs: Array.from(referenceResponseLogProbs(config, weights, s.tokens, s.promptLength, temperature)) })),
  };
}

function parityFile(): string {
  const sets = PARITY_SEEDS.map((seed) => makeParityVectors(seed));
  const doc = {
    generator: "scripts/export-parity-vectors.ts",
    version: PARITY_VECTORS_VERSION,
    seeds: [...PARITY_SEEDS],
    tolerance: sets[0]?.tolerance ?? 1e-6,
    sets,
    model: modelCases(),
  };
  return `${JSON.stringify(doc)}\n`;
}

const text = parityFile();
if (process.argv.includes("--check")) {
  let current = "";
  try {
    current = readFileSync(out, "utf8");
  } catch {
    /* missing file: differs */
  }
  if (current !== text) {
    process.stderr.write(`${out} is out of date: run npx tsx scripts/export-parity-vectors.ts\n`);
    process.exit(1);
  }
  process.stdout.write(`${out} is up to date\n`);
} else {
  writeFileSync(out, text);
  const cases = JSON.parse(text).sets.reduce((n: number, s: { cases: unknown[] }) => n + s.cases.length, 0) as number;
  process.stdout.write(`wrote ${out}: ${PARITY_SEEDS.length} seeds, ${cases} cases, ${text.length} bytes\n`);
}
