import type { Services } from "../runtime/services.ts";
import { createTrainerProvider } from "../runtime/engines.ts";
import { loadEmbedded } from "../runtime/embedded.ts";
import { ConfigError } from "../config/run-config.ts";
import { formatRetrain, reproducesCommit, retrainStep } from "../jobs/retrain.ts";

/**
 * `rlq retrain RUN --step S [--out DIR]`: replay step S's recorded batch into
 * the run's trainer (slime's --load-debug-rollout-data). Exit 1 when the run
 * is deterministic and the weights differ from what the step committed.
 */
export async function retrainCommand(
  s: Services,
  runId: string | undefined,
  stepText: string | undefined,
  outputDir: string | undefined,
  signal: AbortSignal,
): Promise<number> {
  if (!runId) throw new ConfigError("rlq retrain: expected a run id, e.g. rlq retrain r123 --step 4");
  if (stepText === undefined) throw new ConfigError("rlq retrain: --step S is required (the step to retrain, an integer >= 0)");
  const step = Number(stepText);
  if (!Number.isInteger(step) || step < 0) throw new ConfigError(`rlq retrain: --step ${stepText}: expected the step to retrain, an integer >= 0`);
  const trainers = createTrainerProvider(await loadEmbedded());
  try {
    const ctx = await s.contexts.get(runId);
    const r = await retrainStep(
      {
        db: s.db,
        checkpointRoot: s.checkpointRoot,
        trainerFor: (c) => trainers.trainerFor(c),
        signal,
        onProgress: (p) => process.stderr.write(`  ${p.phase} ${p.done}/${p.total}\r`),
      },
      ctx,
      step,
      outputDir === undefined ? {} : { outputDir },
    );
    process.stderr.write("\n");
    process.stdout.write(formatRetrain(runId, r, ctx.config.deterministic));
    if (outputDir !== undefined) process.stdout.write(`  weights in ${r.outputDir}\n`);
    return ctx.config.deterministic && !reproducesCommit(r) ? 1 : 0;
  } finally {
    await trainers.close();
  }
}
