import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";
import { repoRoot, spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { startFakeWandb, type FakeWandb } from "../fakes/fake-wandb.ts";
import { decodeEventKeys, scanRecords } from "../../src/observability/metrics-export/tfevents.ts";
import { openRunSinks, syncRunSinks } from "../../src/observability/metrics-export/metric-sinks.ts";
import { openWandbSink } from "../../src/observability/metrics-export/wandb-sink.ts";
import { readTrainPoints } from "../../src/observability/metrics-export/points.ts";

/**
 * The metric sinks read committed facts and remember what they wrote, so a
 * SIGKILL of `rlq up` mid-run neither drops nor duplicates a point, in the
 * TensorBoard event files or in W&B (a local stand-in that answers as W&B's API).
 */
const wandbKey = "local-wandb-key-0000000000000000000000";

function tensorboardSteps(dir: string): { steps: number[]; evalSteps: number[]; tags: Set<string> } {
  const steps: number[] = [];
  const evalSteps: number[] = [];
  const tags = new Set<string>();
  for (const f of readdirSync(dir)
    .filter((x) => x.startsWith("events.out.tfevents."))
    .sort()) {
    const buf = readFileSync(join(dir, f));
    const scan = scanRecords(buf);
    expect(scan.validBytes, `${f} has no torn tail`).toBe(buf.length);
    for (const r of scan.records) {
      const e = decodeEventKeys(r);
      if (e.fileVersion !== null) continue;
      (e.tags[0]?.startsWith("eval/") ? evalSteps : steps).push(e.step);
      for (const t of e.tags) tags.add(t);
    }
  }
  return { steps, evalSteps, tags };
}

describe("metric sinks (TensorBoard, W&B) over committed facts", () => {
  let world: DemoWorld;
  let wandb: FakeWandb;
  let out: string;
  const procs: Proc[] = [];

  beforeAll(async () => {
    world = await createDemoWorld("sinks");
    wandb = await startFakeWandb(wandbKey);
    out = mkdtempSync(join(tmpdir(), "rlq-sinks-"));
  });
  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    await wandb?.close();
    await world?.close();
    rmSync(out, { recursive: true, force: true });
  });

  it("exports every committed step exactly once through a SIGKILL of rlq up", { timeout: 400_000 }, async () => {
    const tbRoot = join(out, "tb");
    const runId = await world.start(
      [
        "num_rollout=6",
        "rollout_batch_size=8",
        "n_samples_per_prompt=4",
        `tensorboard_dir=${tbRoot}`,
        "use_wandb=true",
        "wandb_project=rlq-sinks",
        "wandb_group=grp-a",
        `wandb_host=${wandb.url}`,
        "wandb_key.env=RLQ_TEST_WANDB_KEY",
        `wandb_dir=${join(out, "wandb")}`,
        "eval_interval=3",
        `eval_prompt_data.demo=${join(repoRoot, "examples/demo/eval.jsonl")}`,
        "n_samples_per_eval_prompt=2",
        "eval_pass_k=[1,2]",
      ],
      "sinks-demo",
    );
    const env = { ...world.env, RLQ_TEST_WANDB_KEY: wandbKey };
    const first = spawnRlq(["up", "--run", runId], env);
    procs.push(first);
    // Kill once the sink has written some steps but the run is not over.
    const tbDir = join(tbRoot, runId);
    await waitFor(
      "the sinks to write two steps",
      async () => existsSync(tbDir) && tensorboardSteps(tbDir).steps.length >= 2 && (wandb.runs.get(`rlq-tests/rlq-sinks/${runId}`)?.history.length ?? 0) >= 2,
      200_000,
      100,
    );
    first.kill("SIGKILL");
    await first.exited;
    const second = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
    procs.push(second);
    expect(await second.exited, second.output()).toBe(0);

    const committed = (await world.db.pool.query<{ step: number }>("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows.map((r) =>
      Number(r.step),
    );
    expect(committed).toEqual([0, 1, 2, 3, 4, 5]);

    // TensorBoard: one event per committed step, in order, with slime's tag names.
    const tb = tensorboardSteps(tbDir);
    expect(tb.steps).toEqual(committed);
    const evalSteps = (await world.db.pool.query<{ step: number }>("SELECT step FROM eval_results WHERE run_id = $1 ORDER BY step", [runId])).rows.map((r) =>
      Number(r.step),
    );
    expect(evalSteps.length).toBeGreaterThanOrEqual(2);
    expect(tb.evalSteps).toEqual(evalSteps);
    for (const tag of ["eval/demo", "eval/demo/pass@1", "eval/demo/pass@2", "eval/demo-truncated_ratio"]) expect(tb.tags.has(tag), tag).toBe(true);
    for (const tag of ["train/pg_loss", "train/train_rollout_logprob_abs_diff", "rollout/raw_reward", "rollout/response_len/mean", "perf/num_samples"])
      expect(tb.tags.has(tag), tag).toBe(true);

    // W&B: the run (named by the rlq run id, in its group), one history line per step, finished.
    const run = wandb.runs.get(`rlq-tests/rlq-sinks/${runId}`);
    expect(run).toBeDefined();
    expect(run?.group).toBe("grp-a");
    expect(run?.displayName).toBe("sinks-demo");
    expect(run?.config.num_rollout).toEqual({ value: 6 });
    const allLines = (run?.history ?? []).map((l) => JSON.parse(l) as Record<string, number>);
    expect(allLines.map((l) => l._step)).toEqual(allLines.map((_, i) => i));
    const lines = allLines.filter((l) => l["rollout/step"] !== undefined);
    expect(lines.map((l) => l["rollout/step"])).toEqual(committed);
    expect(
      allLines
        .filter((l) => l["eval/step"] !== undefined)
        .map((l) => l["eval/step"])
        .sort((a, b) => (a ?? 0) - (b ?? 0)),
    ).toEqual(evalSteps);
    expect(allLines).toHaveLength(committed.length + evalSteps.length);
    // The values are the facts' values.
    const facts = await readTrainPoints(world.db, runId, -1);
    for (const [i, p] of facts.entries()) for (const s of p.scalars) expect(lines[i]?.[s.tag], `${s.tag}@${p.step}`).toBe(s.value);
    expect(run?.finished).toBe(true);
    expect(JSON.parse(run?.summary ?? "{}")["rollout/raw_reward"]).toBe(facts[facts.length - 1]?.scalars.find((s) => s.tag === "rollout/raw_reward")?.value);
    // The key never appears in a request body, only in the Authorization header.
    expect(JSON.stringify(wandb.requests)).not.toContain(wandbKey);

    // A stale sink state (the server took lines, the client died before saving): re-sent, not doubled.
    const dir = join(out, "wandb-crash");
    const settings = {
      mode: "online" as const,
      host: wandb.url,
      apiKey: wandbKey,
      project: "rlq-crash",
      entity: null,
      group: null,
      runName: runId,
      displayName: "x",
      config: {},
      dir,
    };
    const crashing = await openWandbSink(settings);
    wandb.failAfterApply = 1;
    await expect(crashing.write(facts)).rejects.toThrow(/answered 500/);
    const restarted = await openWandbSink(settings);
    expect(restarted.offset()).toBe(0);
    await restarted.write(facts);
    await restarted.write(facts);
    const crashRun = wandb.runs.get(`rlq-tests/rlq-crash/${runId}`);
    expect(crashRun?.history.map((l) => (JSON.parse(l) as Record<string, number>)["rollout/step"])).toEqual(committed);
  });

  it("offline mode writes W&B's history and summary files, once per point, and needs no key", async () => {
    const runId = await world.start(
      [
        "num_rollout=2",
        "rollout_batch_size=8",
        "n_samples_per_prompt=4",
        "use_wandb=true",
        "wandb_project=offline-p",
        "wandb_mode=offline",
        `wandb_dir=${join(out, "wb-off")}`,
      ],
      "offline",
    );
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], world.env);
    procs.push(up);
    expect(await up.exited, up.output()).toBe(0);
    const runDir = join(out, "wb-off", `offline-run-${runId}`);
    const history = () =>
      readFileSync(join(runDir, "files", "wandb-history.jsonl"), "utf8")
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as Record<string, number>);
    expect(history().map((l) => l["rollout/step"])).toEqual([0, 1]);
    // Another pass (a restarted process) adds nothing.
    const deps = { db: world.db, home: world.env.RLQ_HOME as string, secrets: {} };
    const sinks = await openRunSinks(deps, runId);
    expect(await syncRunSinks(deps, runId, sinks)).toEqual({ tensorboard: 0, wandb: 0 });
    sinks.close();
    expect(history()).toHaveLength(2);
    expect(Object.keys(JSON.parse(readFileSync(join(runDir, "files", "wandb-summary.json"), "utf8")) as object)).toContain("train/pg_loss");
  });
});
