import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
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
