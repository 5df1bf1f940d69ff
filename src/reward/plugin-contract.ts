/**
 * The contract of a user reward plugin (`custom_rm_path`, a JS module or an
 * HTTP endpoint speaking the same JSON):
 *
 * - per sample: `async function reward(args, sample)` returns a number or an
 *   object of named components (`{score: 1, acc: true, pred: "42"}`);
 * - with `group_rm`: `async function rewardGroup(args, samples)` returns an
 *   array with one such value per sample, in order.
 *
 * Booleans are accepted where a number is expected and become 1/0 (Python
 * plugins ported from slime return `True`, and slime's own dapo returns
 * `acc` as a bool). Strings are accepted only as dict components (kept as
 * metadata). NaN, ±Infinity, null, nested objects and arrays are rejected.
 * Loading the module is the plugin loader's job; this file only judges what
 * came back.
 */

import { z } from "zod";
import { RewardError, type RewardResult } from "./reward-result.ts";

const numberLike = z.union([z.number(), z.boolean().transform((b) => (b ? 1 : 0))]);

export const pluginRewardComponentsSchema = z
  .record(z.string().min(1), z.union([numberLike, z.string()]))
  .refine((r) => Object.values(r).some((v) => typeof v === "number"), {
    message: "a dict reward needs at least one numeric component",
  });

/** One sample's reward as a plugin may return it; parses to a `RewardResult`. */
export const pluginRewardSchema = z.union([numberLike, pluginRewardComponentsSchema]);

/** A group reward (`rewardGroup`): exactly one reward per sample. */
export function pluginGroupRewardSchema(groupSize: number) {
  return z.array(pluginRewardSchema).length(groupSize);
}

/** Where a plugin value came from, for error messages. */
export interface PluginSite {
  /** The run-config key that named the plugin. Default `custom_rm_path`. */
  option?: string;
  /** The module path or URL as the user wrote it. */
  path: string;
  /** Index of the sample in its group (per-sample rewards). */
  sampleIndex?: number;
}

const EXPECTED = "expected a number or an object of numbers";

/** A short, Python-flavoured rendering of a value for a message: 'abc', NaN, {"a":null}. */
function show(value: unknown): string {
  if (typeof value === "string") return `'${value.length > 80 ? `${value.slice(0, 80)}…` : value}'`;
  if (typeof value === "number" || typeof value === "boolean" || value === null || value === undefined) return String(value);
  if (typeof value === "bigint") return `${value}n`;
  if (typeof value === "function") return "a function";
  let json: string;
  try {
    json = JSON.stringify(value, (_k, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v)) ?? typeof value;
  } catch {
    // Not JSON (a cycle, a BigInt inside): the value's type names it in the message instead.
    json = Object.prototype.toString.call(value);
  }
  return json.length > 120 ? `${json.slice(0, 120)}…` : json;
}

function problem(value: unknown): string {
  if (value === undefined) return `${EXPECTED} (did the function forget to return?)`;
  if (typeof value === "number") return "expected a finite number";
  if (Array.isArray(value)) return `${EXPECTED}; an array is a group reward (only with group_rm, from rewardGroup)`;
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value);
    if (entries.length === 0) return `${EXPECTED}; the object is empty`;
    for (const [k, v] of entries) {
      if (k === "") return `${EXPECTED}; a component has an empty name`;
      const ok = (typeof v === "number" && Number.isFinite(v)) || typeof v === "boolean" || typeof v === "string";
      if (!ok) return `component '${k}' is ${show(v)}; expected a finite number (or a string, kept as metadata)`;
    }
    return `${EXPECTED}; no component is numeric`;
  }
  return EXPECTED;
}

function siteText(where: PluginSite): string {
  return `${where.option ?? "custom_rm_path"} ${where.path}`;
}

/**
 * Validates one sample's plugin reward. Throws RewardError
 * `plugin_reward_invalid`, e.g. "custom_rm_path ./x.js returned 'abc' for
 * sample 3; expected a number or an object of numbers".
 */
export function validatePluginReward(value: unknown, where: PluginSite): RewardResult {
  const parsed = pluginRewardSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const forSample = where.sampleIndex === undefined ? "" : ` for sample ${where.sampleIndex}`;
  throw new RewardError("plugin_reward_invalid", `${siteText(where)} returned ${show(value)}${forSample}; ${problem(value)}`, {
    cause: parsed.error,
  });
}

/**
 * Validates a `rewardGroup` return: an array of exactly `groupSize` valid
 * rewards. Throws RewardError `plugin_group_reward_invalid` naming the
 * length or the first bad element.
 */
export function validatePluginGroupReward(value: unknown, groupSize: number, where: Omit<PluginSite, "sampleIndex">): RewardResult[] {
  const site = siteText(where);
  if (!Array.isArray(value)) {
    throw new RewardError(
      "plugin_group_reward_invalid",
      `${site} (group_rm) returned ${show(value)}; expected an array of ${groupSize} rewards, one per sample in order`,
    );
  }
  if (value.length !== groupSize) {
    throw new RewardError(
      "plugin_group_reward_invalid",
      `${site} (group_rm) returned ${value.length} rewards for a group of ${groupSize} samples; expected one per sample`,
    );
  }
  return value.map((v: unknown, i) => {
    try {
      return validatePluginReward(v, { ...where, sampleIndex: i });
    } catch (e) {
      if (!(e instanceof RewardError)) throw e;
      throw new RewardError("plugin_group_reward_invalid", `${e.message} (group_rm)`, { cause: e });
    }
  });
}
