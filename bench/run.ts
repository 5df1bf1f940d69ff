/**
 * `npm run bench`: every benchmark, each printing JSON and writing
 * bench/results/<name>.json. Needs Postgres and Redis (.ci/services.sh).
 * `npm run bench -- control-plane` runs one.
 */
import { spawnSync } from "node:child_process";

const all = ["control-plane", "recovery", "group-load", "embedded-model", "engine-pool", "tis-mismatch"];
const pick = process.argv.slice(2).filter((a) => !a.startsWith("-"));
for (const name of pick.length > 0 ? pick : all) {
  const r = spawnSync(process.execPath, ["--import", "tsx", `bench/${name}.ts`], { stdio: "inherit" });
  if (r.status !== 0) process.exit(r.status ?? 1);
}
