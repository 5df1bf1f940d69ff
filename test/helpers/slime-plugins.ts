import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";
import { repoRoot } from "./processes.ts";

/** slime users' Python plugins (test/fixtures/slime/plugins), as the tests that run them name them. */
export const SLIME_PLUGINS = "test/fixtures/slime/plugins";

/** What slime's reward function gives for these samples, computed by Python itself (the fixture, through the shim's Sample). */
export function pythonRewards(rows: Array<{ response: string; label: string | null; status: string }>): number[] {
  const script = [
    "import asyncio, json, sys",
    `sys.path[:0] = [${JSON.stringify(join(repoRoot, SLIME_PLUGINS))}, ${JSON.stringify(join(repoRoot, "python/rlq_plugin_host/shim"))}]`,
    "from my_rewards import reward_func",
    "from slime.utils.types import Sample",
    "rows = json.load(sys.stdin)",
    "print(json.dumps([asyncio.run(reward_func(None, Sample(response=r['response'], label=r['label'], status=Sample.Status(r['status'])))) for r in rows]))",
  ].join("\n");
  const r = spawnSync("python3", ["-c", script], { input: JSON.stringify(rows), encoding: "utf8" });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout) as number[];
}

/** The fixture dataset's label per prompt (test/fixtures/prompts.jsonl). */
export function fixtureLabels(): Map<string, string> {
  return new Map(
    readFileSync(join(repoRoot, "test/fixtures/prompts.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { input: string; label: string })
      .map((r) => [r.input, r.label]),
  );
}

/** A kept or filtered sample as the slime-plugin tests read it from rollout_history. */
export interface PluginRow {
  group_id: string;
  prompt: string;
  response: string;
  status: string;
  reward: number;
  outcome: string;
  outcome_reason: string | null;
}

/**
 * The recorded rewards are Python's own, and the fixture's dynamic filter (keep a group iff its
 * rewards vary) gave each group its verdict, with the filter's reason on the dropped ones. Returns
 * the groups seen and how many were filtered.
 */
export function expectPythonVerdicts(rows: PluginRow[]): { groups: number; filtered: number } {
  const labels = fixtureLabels();
  expect(rows.map((r) => r.reward)).toEqual(pythonRewards(rows.map((r) => ({ response: r.response, label: labels.get(r.prompt) ?? null, status: r.status }))));
  const groups = new Map<string, PluginRow[]>();
  for (const r of rows) groups.set(r.group_id, [...(groups.get(r.group_id) ?? []), r]);
  let filtered = 0;
  for (const g of groups.values()) {
    const varies = new Set(g.map((r) => r.reward)).size > 1;
    if (varies) expect(g.every((r) => r.outcome === "kept")).toBe(true);
    else {
      filtered++;
      expect(g.every((r) => r.outcome === "filtered" && /^py_zero_std_/.test(r.outcome_reason ?? ""))).toBe(true);
    }
  }
  return { groups: groups.size, filtered };
}
