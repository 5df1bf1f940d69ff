import type { Db } from "../store/db.ts";
import { loadRunRow } from "../store/run-facts.ts";
import type { RunConfig } from "../config/run-config.ts";
import { decodeRecordedConfig } from "../config/recorded-config.ts";
import { createByteTokenizer, type Tokenizer } from "../data/tokenizer.ts";
import { createRewardScorer, type RewardInput, type RewardScorer } from "./reward-scorer.ts";
import { RlqError } from "../lib/errors.ts";
import { resolvePluginFunction } from "../plugins/http.ts";
import { pluginHttpOptions } from "./http-auth.ts";
import type { CustomGenerateFunction } from "../rollout/custom-generate.ts";

/**
 * What a worker needs to serve one run: its stored, validated config, the
 * tokenizer and the reward scorer. Built once per run per process.
 */
export interface RunContext {
  runId: string;
  config: RunConfig;
  tokenizer: Tokenizer;
  reward: RewardScorer;
  /** custom_generate_function_path: one sample, possibly multi-turn (docs/plugins.md). */
  customGenerate: CustomGenerateFunction | null;
}

export type RmTypeResolver = (rmType: string) => ((s: RewardInput) => unknown) | null;
export type TokenizerFactory = (config: RunConfig) => Promise<Tokenizer>;

export interface RunContextCache {
  get(runId: string): Promise<RunContext>;
}

export function createRunContextCache(db: Db, options: { resolveRmType?: RmTypeResolver; tokenizerFor?: TokenizerFactory } = {}): RunContextCache {
  const cache = new Map<string, Promise<RunContext>>();
  const build = async (runId: string): Promise<RunContext> => {
    const row = await loadRunRow(db, runId);
    if (!row) throw new RlqError("run_not_found", `run ${runId} does not exist`);
    const config = decodeRecordedConfig(row.config, `run ${runId} config`);
    const tokenizer = config.tokenizer === "bytes" || !options.tokenizerFor ? createByteTokenizer() : await options.tokenizerFor(config);
    const reward = await createRewardScorer(config, options.resolveRmType ?? (() => null));
    const customGenerate = config.custom_generate_function_path
      ? await resolvePluginFunction<CustomGenerateFunction>(
          config.custom_generate_function_path,
          process.cwd(),
          "generate",
          "custom_generate_function_path",
          pluginHttpOptions(config),
        )
      : null;
    return { runId, config, tokenizer, reward, customGenerate };
  };
  return {
    get(runId) {
      let hit = cache.get(runId);
      if (!hit) {
        hit = build(runId);
        // A failed build is not kept: its caller gets the rejection through `hit`, and the next get builds again.
        hit.catch(() => cache.delete(runId));
        cache.set(runId, hit);
      }
      return hit;
    },
  };
}
