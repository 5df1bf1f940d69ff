/**
 * `npm run bench`: every benchmark, each printing JSON and writing
 * bench/results/<name>.json. Needs Postgres and Redis (.ci/services.sh).
 * `npm run bench -- control-plane` runs one.
 */
import { spawnSync } from "node:child_process";

// name → the runs of its script (arguments). control-plane runs twice: short responses (its
// default, where the fixed cost per sample shows) and ~440-token ones (where the per-token cost does).
const all: Record<string, string[][]> = {
  "control-plane": [[], ["--rbs", "512", "--max-len", "1024", "--stop-prob", "0.002"]],
  recovery: [[]],
  "group-load": [[]],
  "embedded-model": [[]],
  "engine-pool": [[]],
  "tis-mismatch": [[]],
};
const pick = process.argv.slice(2).filter((a) => !a.startsWith("-"));
for (const name of pick.length > 0 ? pick : Object.keys(all)) {
  for (const args of all[name] ?? [[]]) {
    const r = spawnSync(process.execPath, ["--import", "tsx", `bench/${name}.ts`, ...args], { stdio: "inherit" });
    if (r.status !== 0) process.exit(r.status ?? 1);
  }
}
