/**
 * `npm run bench`: every benchmark, each printing JSON and writing
 * bench/results/<name>.json. Needs Postgres and Redis (.ci/services.sh).
 * `npm run bench -- control-plane` runs one; `npm run bench -- cluster-sim --full` the whole cluster simulation.
 */
import { spawnSync } from "node:child_process";

// name → the runs of its script (arguments). control-plane runs twice: short responses (its
// default, where the fixed cost per sample shows) and ~440-token ones (where the per-token cost does).
const all: Record<string, string[][]> = {
  "control-plane": [[], ["--rbs", "512", "--max-len", "1024", "--stop-prob", "0.002"]],
  recovery: [["--compare-snapshots", "--reps", "6"]],
  "group-load": [[]],
  "round-write": [[]],
  "embedded-model": [[]],
  "engine-pool": [[]],
  "tis-mismatch": [[]],
  // A short default (8 simulated engines, all modes, one repetition, ~8 min): the full matrix
  // (8 engines with medians of 3, 64 and 512 one run each) is `npx tsx bench/cluster-sim.ts` (~45 min), or
  // `npm run bench -- cluster-sim --full`, and writes bench/results/cluster-sim.json.
  "cluster-sim": [process.argv.includes("--full") ? [] : ["--engines", "8", "--reps", "1", "--out", "cluster-sim-short"]],
};
const pick = process.argv.slice(2).filter((a) => !a.startsWith("-"));
for (const name of pick.length > 0 ? pick : Object.keys(all)) {
  for (const args of all[name] ?? [[]]) {
    const r = spawnSync(process.execPath, ["--import", "tsx", `bench/${name}.ts`, ...args], { stdio: "inherit" });
    if (r.status !== 0) process.exit(r.status ?? 1);
  }
}
