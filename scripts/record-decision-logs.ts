/**
 * Records real decision logs for the decision core's replay tests
 * (test/replay/decision-logs.test.ts): each case runs `rlq up` end to end
 * against the fake SGLang server and the fake trainer (the integration tests'
 * world: its own database, dropped after) and writes the run's `decisions` to
 * test/fixtures/decision-logs/NAME.json. Needs the test services (Postgres,
 * Redis). Run: npx tsx scripts/record-decision-logs.ts
 *
 * sync-partial and async-k1 were recorded at config version 1 (src/config/config-versions.ts), and
 * the replay tests use them as logs of an older rlq: a new case goes under a new name, and
 * re-recording those two loses that (test/replay/decision-logs.test.ts then fails, saying so).
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import setup from "../test/helpers/global-setup.ts";
import { createWorld } from "../test/helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../test/helpers/processes.ts";
import { loadDecisions } from "../src/store/decision-log.ts";

// Slow tokens (ms per token) keep rounds in flight when a step is sealed or the weights sync, so the
// logs hold aborts, drains and resumed partial rollouts.
const cases: Record<string, { config: Record<string, unknown>; tokenDelayMs: number }> = {
  // Sync mode: over-sampling, filter drops, seals that abort rounds, partial rollouts resumed and masked.
  "sync-partial": { config: { num_rollout: 4, partial_rollout: true, mask_offpolicy_in_partial_rollout: true }, tokenDelayMs: 15 },
  // Async mode: groups joining the earliest unsealed step, syncs that abort rounds, admission.
  "async-k1": { config: { num_rollout: 4, train_async: true, max_staleness: 1, staleness_policy: "mask", use_tis: true }, tokenDelayMs: 15 },
};

await setup();
const out = join(repoRoot, "test/fixtures/decision-logs");
mkdirSync(out, { recursive: true });
for (const [name, { config, tokenDelayMs }] of Object.entries(cases)) {
  const w = await createWorld(`rec_${name.replace(/-/g, "_")}`, { engineArgs: ["--token-delay-ms", String(tokenDelayMs)] });
  try {
    const runId = await w.start(config);
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    if ((await up.exited) !== 0) throw new Error(`${name}: rlq up failed:\n${up.output()}`);
    const log = await loadDecisions(w.db, runId);
    // Machine-specific strings (paths, ports) out of the fixture: the fold only parses them.
    const text = JSON.stringify(
      log.map((d) => ({ seq: d.seq, kind: d.kind, payload: d.payload })),
      null,
      0,
    )
      .replaceAll(repoRoot, ".")
      .replace(/http:\/\/127\.0\.0\.1:\d+/g, "http://127.0.0.1:1");
    writeFileSync(join(out, `${name}.json`), text.replaceAll("},{", "},\n{") + "\n");
    console.log(`${name}: ${log.length} decisions`);
  } finally {
    await w.close();
  }
}
