import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { readEnv, secretSource } from "../config/env.ts";
import { readOptionalSecret } from "../config/secrets.ts";
import type { RunConfig } from "../config/run-config.ts";
import type { Db } from "../store/db.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { ensureLocalWeights } from "../trainer/checkpoint-transfer.ts";
import { createRemoteTrainer } from "../trainer/remote-trainer.ts";
import type { Trainer } from "../trainer/trainer.ts";
import { RlqError } from "../lib/errors.ts";
import type { RunContext } from "./run-context.ts";

/** The remote trainer's API key, read in this process from the reference in the run config. */
export function trainerApiKey(config: RunConfig): string | null {
  const t = config.trainer;
  if (t.kind !== "remote") return null;
  try {
    return readOptionalSecret(t.api_key ?? undefined, "trainer.api_key", secretSource()) ?? null;
  } catch (e) {
    throw new RlqError("secret_unavailable", (e as Error).message, { cause: e, isRetriable: false });
  }
}

export function createRemoteTrainerFor(config: RunConfig): Trainer {
  const t = config.trainer;
  if (t.kind !== "remote") throw new RlqError("invariant_violated", "unreachable: not a remote trainer");
  return createRemoteTrainer({ url: t.url, apiKey: trainerApiKey(config), batchHost: t.advertise_address, checkpoints: t.checkpoints });
}

/**
 * Before an embedded engine loads committed version `version` (> 0) from `uri`: the directory on
 * this host that holds those weights, equal to the committed sha256. With `trainer.checkpoints:
 * fetch` the committed path is another host's (its RLQ_HOME), so the weights go to this host's
 * `RLQ_HOME/checkpoints/RUN/step-S/attempt-X`, downloaded from the trainer unless already there;
 * otherwise (a shared mount) the committed path itself, its hash checked.
 */
export async function ensureCheckpointHere(db: Db, ctx: RunContext, version: number, uri: string): Promise<string> {
  const committed = fileURLToPath(uri);
  if (version === 0) return committed;
  const row = await loadTrainStep(db, ctx.runId, version - 1);
  if (!row) return committed;
  const t = ctx.config.trainer;
  if (t.kind === "remote" && t.checkpoints === "fetch") {
    const local = join(resolve(readEnv().RLQ_HOME, "checkpoints"), ctx.runId, basename(dirname(committed)), basename(committed));
    await ensureLocalWeights(local, row.checkpointSha256, { url: t.url, token: trainerApiKey(ctx.config) });
    return local;
  }
  await ensureLocalWeights(committed, row.checkpointSha256, null);
  return committed;
}
