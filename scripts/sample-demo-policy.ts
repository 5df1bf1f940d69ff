/**
 * @file Samples the embedded demo policy (examples/demo/warm-start) on the demo task's prompts and writes what it
 * answered, graded, so scripts/build-preferences.py can pair the policy's own wrong answers against the right one:
 * hard negatives from the distribution a GRPO run rewarded by the reward model will show it (a carry slip, a digit
 * off by one, a box left unclosed), rather than only the synthetic ones it draws itself.
 *
 * Usage:
 *   npx tsx scripts/sample-demo-policy.ts --out DIR [--samples 8] [--checkpoint examples/demo/warm-start]
 * Writes DIR/train.jsonl and DIR/eval.jsonl (from examples/demo/{train,eval}.jsonl), one row per sample:
 * {"input", "label", "response", "correct"}; prints each split's count and solve rate.
 */
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { exactBoxedReward, type ArithmeticProblem } from "../examples/demo/task.ts";
import { createEmbeddedEngine } from "../src/engines/embedded/embedded-engine.ts";
import { mixSeed } from "../src/model/prng.ts";
import { createDemoTokenizer } from "../src/model/tokenizer.ts";

const { values: args } = parseArgs({
  options: {
    out: { type: "string" },
    fixtures: { type: "string", default: "examples/demo" },
    checkpoint: { type: "string" },
    samples: { type: "string", default: "8" },
    seed: { type: "string", default: "5" },
  },
});

async function main(): Promise<void> {
  if (!args.out) throw new Error("--out DIR is required: where train.jsonl and eval.jsonl of the policy's samples go");
  const fixtures = resolve(args.fixtures);
  const tokenizer = createDemoTokenizer();
  const samplesPerPrompt = Number(args.samples);
  const seed = Number(args.seed);
  const engine = await createEmbeddedEngine({ checkpointUri: resolve(args.checkpoint ?? join(fixtures, "warm-start")), maxBatchSize: 64 });
  await mkdir(args.out, { recursive: true });
  try {
    for (const split of ["train", "eval"] as const) {
      const problems = (await readFile(join(fixtures, `${split}.jsonl`), "utf8"))
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as ArithmeticProblem);
      const rows: string[] = [];
      let solved = 0;
      // 64 prompts at a time keeps the engine's batch full without holding every request in flight.
      for (let start = 0; start < problems.length; start += 64) {
        const chunk = problems.slice(start, start + 64);
        const answers = await Promise.all(
          chunk.flatMap((p, g) =>
            Array.from({ length: samplesPerPrompt }, (_, i) =>
              engine
                .generate({
                  requestId: `sample-${split}-${start + g}-${i}`,
                  inputIds: tokenizer.formatPrompt(p.input),
                  sampling: {
                    temperature: 1,
                    topP: 1,
                    topK: -1,
                    maxNewTokens: 8,
                    stopTokenIds: [tokenizer.eosId],
                    seed: mixSeed(seed, split === "train" ? 0 : 1, start + g, i),
                  },
                })
                .then((r) => ({ p, response: tokenizer.decode(r.tokenIds) })),
            ),
          ),
        );
        for (const { p, response } of answers) {
          const correct = exactBoxedReward(response, p.label);
          solved += correct;
          rows.push(JSON.stringify({ input: p.input, label: p.label, response, correct }));
        }
      }
      const path = join(args.out, `${split}.jsonl`);
      await writeFile(path, rows.join("\n") + "\n");
      console.log(JSON.stringify({ split, samples: rows.length, solveRate: Number((solved / rows.length).toFixed(4)), path }));
    }
  } finally {
    await engine.close();
  }
}

await main();
