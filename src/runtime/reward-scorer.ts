/**
 * Turns a run's reward settings (rm_type, custom_rm_path, group_rm,
 * reward_key) into one `score(group)` call. A plugin's return value is
 * validated: a wrong shape is an unrecoverable error naming the plugin, the
 * sample and what was expected; the run pauses with that reason.
 */

import { z } from "zod";
import type { RunConfig } from "../config/run-config.ts";
import { resolvePluginFunction } from "../plugins/http.ts";
import { pluginHttpOptions, rmHttpOptions } from "./http-auth.ts";
import { createRemoteReward } from "../reward/remote.ts";
import { loadOnnxRewardModel } from "../reward/learned.ts";
import { RlqError } from "../lib/errors.ts";

export interface RewardInput {
  sampleIndex: number;
  prompt: string;
  response: string;
  label: string | null;
  metadata: Record<string, unknown>;
  status: string;
}

export interface ScoredReward {
  value: number;
  components: Record<string, unknown>;
}

export interface RewardScorer {
  score(group: readonly RewardInput[]): Promise<ScoredReward[]>;
}

type SampleRewardFn = (args: RunConfig, sample: RewardInput) => unknown;
type GroupRewardFn = (args: RunConfig, samples: readonly RewardInput[]) => unknown;

const rewardValueSchema = z.union([z.number().finite(), z.record(z.string(), z.unknown())]);

export function selectReward(value: unknown, rewardKey: string | null, where: string): ScoredReward {
  const parsed = rewardValueSchema.safeParse(value);
  if (!parsed.success) {
    throw new RlqError("plugin_bad_return", `${where} returned ${JSON.stringify(value)}; expected a finite number or an object of named components`);
  }
  const v = parsed.data;
  if (typeof v === "number") return { value: v, components: {} };
  const key = rewardKey ?? (Object.keys(v).length === 1 ? (Object.keys(v)[0] as string) : null);
  if (key === null) {
    throw new RlqError("reward_key_missing", `${where} returned components ${Object.keys(v).join(", ")}; set reward_key to choose the one trained on`);
  }
  const chosen = v[key];
  if (typeof chosen !== "number" || !Number.isFinite(chosen)) {
    const numeric = Object.keys(v).filter((k) => typeof v[k] === "number");
    throw new RlqError(
      "reward_key_missing",
      `${where}: reward_key '${key}' is ${JSON.stringify(chosen)}, not a number (numeric components: ${numeric.join(", ") || "none"})`,
    );
  }
  return { value: chosen, components: v };
}

export async function createRewardScorer(config: RunConfig, resolveRmType: (rmType: string) => ((s: RewardInput) => unknown) | null): Promise<RewardScorer> {
  const where = (i: number) => `${config.custom_rm_path ? `custom_rm_path ${config.custom_rm_path}` : `rm_type ${config.rm_type}`} (sample ${i})`;
  if (config.custom_rm_path) {
    if (config.group_rm) {
      const fn = await resolvePluginFunction<GroupRewardFn>(config.custom_rm_path, process.cwd(), "reward_group", "custom_rm_path", pluginHttpOptions(config));
      return {
        async score(group) {
          let out: unknown;
          try {
            out = await fn(config, group);
          } catch (e) {
            if (e instanceof RlqError) throw e;
            throw new RlqError("plugin_threw", `custom_rm_path ${config.custom_rm_path} threw: ${(e as Error).message}`, { cause: e });
          }
          if (!Array.isArray(out) || out.length !== group.length) {
            throw new RlqError(
              "plugin_bad_return",
              `custom_rm_path ${config.custom_rm_path} (group_rm) returned ${JSON.stringify(out)?.slice(0, 200)}; expected an array of ${group.length} rewards`,
            );
          }
          return out.map((v, i) => selectReward(v, config.reward_key, where(i)));
        },
      };
    }
    const fn = await resolvePluginFunction<SampleRewardFn>(config.custom_rm_path, process.cwd(), "reward", "custom_rm_path", pluginHttpOptions(config));
    return {
      async score(group) {
        return Promise.all(
          group.map(async (s, i) => {
            let out: unknown;
            try {
              out = await fn(config, s);
            } catch (e) {
              if (e instanceof RlqError) throw e;
              throw new RlqError("plugin_threw", `custom_rm_path ${config.custom_rm_path} threw on sample ${i}: ${(e as Error).message}`, { cause: e });
            }
            return selectReward(out, config.reward_key, where(i));
          }),
        );
      },
    };
  }
  const rmType = config.rm_type as string;
  if (rmType.trim() === "remote_rm") {
    const rm = createRemoteReward({ url: config.rm_url as string, ...rmHttpOptions(config) });
    return { score: async (g) => (await rm.scoreGroup(g)).map((v, i) => selectReward(v, config.reward_key, where(i))) };
  }
  if (rmType.trim() === "onnx_rm") {
    const model = await loadOnnxRewardModel(config.rm_model_path as string);
    return { score: async (g) => (await model.score(g)).map((v, i) => selectReward(v, config.reward_key, where(i))) };
  }
  const fn = resolveRmType(rmType);
  if (!fn) throw new RlqError("config_invalid", `rm_type '${rmType}' is not a known reward type`);
  return {
    async score(group) {
      return Promise.all(group.map(async (s, i) => selectReward(await fn(s), config.reward_key, where(i))));
    },
  };
}
