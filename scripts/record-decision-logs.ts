/**
 * Records real decision logs for the decision core's replay tests (test/replay/): each case runs
 * `rlq up` end to end against the fake SGLang server and the fake trainer (the integration tests'
 * world: its own database, dropped after), drives the run to the end its log is for (completed,
 * cancelled, or paused for a fault) and writes the run's `decisions` to
 * test/fixtures/decision-logs/NAME.json. Needs the test services (Postgres, Redis).
 *
 *   npx tsx scripts/record-decision-logs.ts            records every case whose log is missing
 *   npx tsx scripts/record-decision-logs.ts NAME...    records (or re-records) the cases named
 *
 * sync-partial and async-k1 were recorded at config version 1 (src/config/config-versions.ts), and
 * the replay tests use them as logs of an older rlq: they are frozen here, and re-recording them
 * would lose that (test/replay/decision-logs.test.ts then fails, saying so). A new case goes under
 * a new name, with its expected end in test/replay/corpus.test.ts.
 */
import { mkdirSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import setup from "../test/helpers/global-setup.ts";
import { createWorld, type World } from "../test/helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../test/helpers/processes.ts";
import { setFault } from "../test/fakes/fake-engine-control.ts";
import { loadDecisions } from "../src/store/decision-log.ts";
import { requestRunChange } from "../src/api.ts";
import type { DecisionKind } from "../src/core/decisions.ts";

interface Case {
  config: Record<string, unknown>;
  /** Milliseconds per token of the fake SGLang: slow tokens keep rounds in flight when a step is sealed or the weights sync. */
  tokenDelayMs: number;
  engineArgs?: string[];
  trainerArgs?: string[];
  /** Drives the run to its recorded end; by default `rlq up --exit-when-done` completes it. */
  drive?: (w: World, runId: string) => Promise<void>;
  /** Kinds the log is recorded for: the script fails rather than write a log without them. */
  holds?: DecisionKind[];
  /** Recorded by an older rlq; never written again. */
  isFrozen?: boolean;
}

const fixture = (name: string) => join(repoRoot, "test/fixtures", name);

const cases: Record<string, Case> = {
  // Sync mode: over-sampling, filter drops, seals that abort rounds, partial rollouts resumed and masked.
  "sync-partial": {
    config: { num_rollout: 4, partial_rollout: true, mask_offpolicy_in_partial_rollout: true },
    tokenDelayMs: 15,
    isFrozen: true,
  },
  // Async mode: groups joining the earliest unsealed step, syncs that abort rounds, admission.
  "async-k1": {
    config: { num_rollout: 4, train_async: true, max_staleness: 1, staleness_policy: "mask", use_tis: true },
    tokenDelayMs: 15,
    isFrozen: true,
  },
  // Async mode with weight_update_mode drain: each sync waits for the rounds in flight instead of aborting them.
  "async-drain": {
    config: { num_rollout: 4, train_async: true, max_staleness: 1, staleness_policy: "mask", weight_update_mode: "drain" },
    tokenDelayMs: 15,
    holds: ["weights.syncing"],
  },
  // Sync mode, evals before training, every second step and at the end; no partial rollouts, so a seal discards the rounds it aborts.
  "sync-eval": {
    config: {
      num_rollout: 3,
      eval_interval: 2,
      eval_prompt_data: { small: fixture("eval.jsonl") },
      n_samples_per_eval_prompt: 2,
      eval_max_response_len: 12,
    },
    tokenDelayMs: 15,
    holds: ["eval.dispatched", "eval.recorded"],
  },
  // staleness_policy drop: resumed partial rollouts are stale (max_staleness 0), cut and regenerated once, then discarded.
  "sync-drop": {
    config: {
      num_rollout: 4,
      rollout_batch_size: 2,
      n_samples_per_prompt: 2,
      over_sampling_batch_size: 6,
      rollout_max_response_len: 48,
      dynamic_sampling_filter_path: null,
      partial_rollout: true,
      max_staleness: 0,
      staleness_policy: "drop",
      max_regenerations: 1,
    },
    tokenDelayMs: 12,
    engineArgs: ["--stop-prob", "0.04"],
    holds: ["group.cut"],
  },
  // The example rollout function (slime's over-sampling + dynamic filter loop) plans each step.
  "rollout-fn": {
    config: { num_rollout: 2, partial_rollout: true, rollout_function_path: join(repoRoot, "examples/rollout-function/rollout.ts:rollout") },
    tokenDelayMs: 5,
    holds: ["rollout_fn.called"],
  },
  // A rollout function that puts a drawn group back in the buffer, which the next step's draw serves first.
  "rollout-fn-buffer": {
    config: { num_rollout: 2, rollout_function_path: fixture("rollout-buffer.mjs") },
    tokenDelayMs: 5,
    holds: ["rollout_fn.called"],
  },
  // An amend mid-run: num_rollout extended from 3 to 4 after the first step is trained.
  amend: {
    config: { num_rollout: 3 },
    tokenDelayMs: 15,
    drive: async (w, runId) => {
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
      await untilTrained(w, runId, 1);
      await requestRunChange(w.db, runId, "amend", { num_rollout: 4, train_max_attempts: 4 });
      await exits(up, 0, "the amended run to complete");
    },
    holds: ["run.amended"],
  },
  // An operator pauses the run, resumes it, and cancels it before it completes.
  "pause-resume-cancel": {
    config: { num_rollout: 8 },
    tokenDelayMs: 15,
    drive: async (w, runId) => {
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
      await untilTrained(w, runId, 1);
      await requestRunChange(w.db, runId, "pause");
      await untilStatus(w, runId, "paused");
      await requestRunChange(w.db, runId, "resume");
      await untilTrained(w, runId, 2);
      await requestRunChange(w.db, runId, "cancel");
      await exits(up, 0, "the cancelled run's rlq up to exit");
    },
  },
  // Error path: a reward function that throws; its reward job fails unrecoverably and the run pauses with the reason.
  "reward-throws": {
    config: { num_rollout: 2, custom_rm_path: fixture("reward-throws.mjs") },
    tokenDelayMs: 1,
    drive: pausedForAFault,
  },
  // Error path: every attempt of step 1's train job fails; after train_max_attempts the run pauses, and resumes to completion once the trainer is fixed.
  "train-fails": {
    config: { num_rollout: 3, train_max_attempts: 2 },
    tokenDelayMs: 1,
    trainerArgs: ["--step-ms", "20", "--fail-step", "1"],
    drive: async (w, runId) => {
      await pausedForAFault(w, runId);
      await setFault(w.trainer.url, { fail_step: -1 });
      await requestRunChange(w.db, runId, "resume");
      await exits(spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env), 0, "the resumed run to complete");
    },
  },
  // Error path: the engines serve another run's weights (version 4) and this run has no ref_load: it pauses at start.
  "engine-version": {
    config: { num_rollout: 1 },
    tokenDelayMs: 1,
    engineArgs: ["--weight-version", "4"],
    drive: pausedForAFault,
  },
  // Error path: a rollout function that returns one group short pauses the run (plugin_bad_return).
  "rollout-fn-bad-return": {
    config: { num_rollout: 1, dynamic_sampling_filter_path: null, rollout_function_path: fixture("rollout-bad-return.mjs") },
    tokenDelayMs: 1,
    drive: pausedForAFault,
    holds: ["rollout_fn.called"],
  },
  // Bad dataset rows: recorded in run.created with their line numbers; the run trains on the rest.
  "bad-rows": {
    config: {
      num_rollout: 2,
      prompt_data: fixture("bad-rows.jsonl"),
      rollout_batch_size: 2,
      n_samples_per_prompt: 2,
      over_sampling_batch_size: 2,
      dynamic_sampling_filter_path: null,
    },
    tokenDelayMs: 1,
  },
  // Colocated mode: each step's engines released after its rollout drained, then trained, weights
  // resumed, the trained version loaded, KV cache resumed (core/colocate.ts).
  colocate: {
    config: { num_rollout: 3, colocate: true, partial_rollout: true },
    tokenDelayMs: 5,
    holds: ["engines.released", "engines.resumed"],
  },
};

type RlqProc = ReturnType<typeof spawnRlq>;

async function exits(p: RlqProc, code: number, what: string): Promise<void> {
  const got = await p.exited;
  if (got !== code) throw new Error(`${what}: rlq exited ${String(got)}, expected ${code}:\n${p.output().slice(-4000)}`);
}

async function untilTrained(w: World, runId: string, steps: number): Promise<void> {
  await waitFor(`${steps} step(s) of run ${runId} trained`, async () => {
    const r = await w.db.pool.query("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'step.trained'", [runId]);
    return (r.rows[0] as { n: number }).n >= steps;
  });
}

async function untilStatus(w: World, runId: string, status: string): Promise<void> {
  await waitFor(`run ${runId} ${status}`, async () => {
    const r = await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId]);
    return (r.rows[0] as { status: string } | undefined)?.status === status;
  });
}

/** `rlq up --exit-when-done` exits 1 on a run paused for a fault. */
async function pausedForAFault(w: World, runId: string): Promise<void> {
  await exits(spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env), 1, "the run to pause for a fault");
}

async function record(name: string, c: Case, out: string): Promise<void> {
  const w = await createWorld(`rec_${name.replace(/-/g, "_")}`, {
    engineArgs: ["--token-delay-ms", String(c.tokenDelayMs), ...(c.engineArgs ?? [])],
    ...(c.trainerArgs ? { trainerArgs: c.trainerArgs } : {}),
  });
  try {
    const runId = await w.start(c.config);
    if (c.drive) await c.drive(w, runId);
    else await exits(spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env), 0, `${name}: rlq up`);
    const log = await loadDecisions(w.db, runId);
    const missing = (c.holds ?? []).filter((k) => !log.some((d) => d.kind === k));
    if (missing.length > 0) throw new Error(`${name}: the recorded log has no ${missing.join(", ")}; record it again (a loaded machine can change the timing)`);
    // Machine-specific strings (paths, ports) out of the fixture: the fold only parses them.
    const text = JSON.stringify(
      log.map((d) => ({ seq: d.seq, kind: d.kind, payload: d.payload })),
      null,
      0,
    )
      .replaceAll(repoRoot.replace(/\/$/, ""), ".")
      .replace(/http:\/\/127\.0\.0\.1:\d+/g, "http://127.0.0.1:1");
    writeFileSync(join(out, `${name}.json`), text.replaceAll("},{", "},\n{") + "\n");
    console.log(`${name}: ${log.length} decisions`);
  } finally {
    await w.close();
  }
}

const out = join(repoRoot, "test/fixtures/decision-logs");
const named = process.argv.slice(2);
for (const n of named) {
  const c = cases[n];
  if (!c) throw new Error(`no case '${n}' (cases: ${Object.keys(cases).join(", ")})`);
  if (c.isFrozen) throw new Error(`${n} is a log of an older rlq (config version 1): restore it from git instead of recording it again`);
}
const chosen = named.length > 0 ? named : Object.keys(cases).filter((n) => !existsSync(join(out, `${n}.json`)));
if (chosen.length === 0) console.log("every case has its log; name the ones to record again");
else {
  await setup();
  mkdirSync(out, { recursive: true });
  for (const name of chosen) await record(name, cases[name] as Case, out);
}
