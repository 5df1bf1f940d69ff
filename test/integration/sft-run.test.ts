import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * SFT as a run mode (loss_type sft_loss, docs/sft.md): the demo's prompts with their solutions
 * (`\boxed{sum}`) as responses, trained by the PyTorch trainer (workers/trainer-torch/server.py
 * --device cpu) with no rollout: the controller writes each drawn row's response as its round.
 * One run goes through uninterrupted; a second, identical run is SIGKILLed twice (after its first
 * draw's commit, before the drawn rows' rounds are written; and after its first step) and restarted. Both must record every step in SQL (train_steps, the `loss` metric,
 * the responses in rollout_history), and the killed run must train exactly what the other trained:
 * the same rows at each step and bit-identical weights at every step; its decision log replays clean.
 */
const SERVER = join(repoRoot, "workers/trainer-torch/server.py");
const STEPS = 4;
const BATCH = 8;

const python = requirePythonModules(["torch", "numpy"]);

describe("an SFT run (loss_type sft_loss) with the PyTorch trainer", () => {
  let w: World;
  let child: ChildProcess | undefined;
  let log = "";
  let port = 0;
  let dataPath = "";
  beforeAll(async () => {
    w = await createWorld("sftrun");
    // The demo's train split with its solutions: the response is what the demo's grader accepts.
    const dir = mkdtempSync(join(tmpdir(), "rlq-sft-"));
    dataPath = join(dir, "sft.jsonl");
    const rows = readFileSync(join(repoRoot, "examples/demo/train.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .slice(0, 64)
      .map((l) => JSON.parse(l) as { input: string; label: string });
    writeFileSync(dataPath, rows.map((r) => JSON.stringify({ input: r.input, response: `\\boxed{${r.label}}` })).join("\n") + "\n");
    child = spawn(python, [SERVER, "--port", "0", "--device", "cpu", "--threads", "1"], { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] });
    child.stderr?.on("data", (d: Buffer) => {
      log += d.toString();
      if (log.length > 200_000) log = log.slice(-100_000);
    });
    port = await new Promise<number>((resolve, reject) => {
      let out = "";
      child?.stdout?.on("data", (d: Buffer) => {
        out += d.toString();
        const m = /listening (\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      child?.on("exit", (c) => reject(new Error(`trainer exited (${c}) before listening: ${log}`)));
    });
  }, 120_000);
  afterAll(async () => {
    child?.kill("SIGKILL");
    await w?.close();
  });

  const config = () => ({
    prompt_data: dataPath,
    label_key: "response",
    loss_type: "sft_loss",
    tokenizer: "model",
    ref_load: join(repoRoot, "examples/demo/warm-start"),
    rm_type: "math",
    rollout_batch_size: BATCH,
    n_samples_per_prompt: 1,
    num_rollout: STEPS,
    rollout_max_response_len: 8,
    rollout_stop_token_ids: [2],
    rollout_shuffle: true,
    lr: 1e-3,
    engine: { kind: "embedded" },
    trainer: { kind: "remote", url: `http://127.0.0.1:${port}` },
  });

  const runToEnd = async (runId: string) => {
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([up.exited, new Promise<string>((r) => (timer = setTimeout(() => r("still running after 240 s"), 240_000)))]);
    clearTimeout(timer);
    up.kill("SIGTERM");
    expect(code, `${up.output()}\n--- trainer ---\n${log}`).toBe(0);
  };

  /** Per step: the dataset rows it trained (by draw order) and the responses recorded. */
  const trained = async (runId: string) =>
    (
      await w.db.pool.query(
        `SELECT h.trained_step AS step, array_agg(d.dataset_index ORDER BY h.draw_ordinal) AS rows, array_agg(h.response ORDER BY h.draw_ordinal) AS responses
           FROM rollout_history h JOIN drawn_prompts d ON d.run_id = h.run_id AND d.draw_ordinal = h.draw_ordinal
          WHERE h.run_id = $1 AND h.trained_step IS NOT NULL GROUP BY 1 ORDER BY 1`,
        [runId],
      )
    ).rows as Array<{ step: number; rows: number[]; responses: string[] }>;

  /** Per step, a hash of the committed weights' tensor bytes (the safetensors header names the run). */
  const weights = async (runId: string) =>
    (await w.db.pool.query("SELECT checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows.map((r) => {
      const bytes = readFileSync(join(fileURLToPath(String(r.checkpoint_uri)), "weights.safetensors"));
      const headerEnd = 8 + Number(bytes.readBigUInt64LE(0));
      return createHash("sha256").update(bytes.subarray(headerEnd)).digest("hex");
    });

  it("trains every step from the dataset, records it in SQL, and resumes exactly after a SIGKILL", async () => {
    const { runId: plain } = await startRun(w.db, { config: config() });
    await runToEnd(plain);

    const steps = (await w.db.pool.query("SELECT step, num_samples FROM train_steps WHERE run_id = $1 ORDER BY step", [plain])).rows;
    expect(steps).toEqual(Array.from({ length: STEPS }, (_, step) => ({ step, num_samples: BATCH })));
    const loss = (await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'loss' ORDER BY step", [plain])).rows.map((r) =>
      Number(r.value),
    );
    expect(loss).toHaveLength(STEPS);
    for (const l of loss) expect(l).toBeGreaterThan(0);
    const plainTrained = await trained(plain);
    expect(plainTrained.map((s) => s.rows.length)).toEqual(Array.from({ length: STEPS }, () => BATCH));
    // Every response is a dataset row's solution, never a sampled one.
    const data = readFileSync(dataPath, "utf8")
      .trim()
      .split("\n")
      .map((l) => (JSON.parse(l) as { response: string }).response);
    for (const s of plainTrained) expect(s.responses).toEqual(s.rows.map((i) => data[i]));

    const { runId: killed } = await startRun(w.db, { config: config() });
    // First kill: inside the SFT window, after the draw's commit and before the controller writes the drawn rows'
    // rounds (RLQ_CRASH_AT, src/lib/crash-points.ts). The restart must write them, and no rollout job may.
    const crashFile = join(tmpdir(), `rlq-sft-crash-${killed}`);
    const crashing = spawnRlq(["up", "--run", killed], { ...w.env, RLQ_CRASH_AT: `controller.after_draw:once=${crashFile}` });
    expect(await crashing.exited, crashing.output()).toBe("SIGKILL");
    const drawn = await w.db.pool.query("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn'", [killed]);
    const rounds = await w.db.pool.query("SELECT count(*)::int AS n FROM group_rounds WHERE run_id = $1", [killed]);
    expect([drawn.rows[0].n, rounds.rows[0].n]).toEqual([1, 0]);
    // Second kill: SIGKILL once the first step is committed, mid-run.
    const up = spawnRlq(["up", "--run", killed], w.env);
    await waitFor("the first SFT step", async () => (await w.db.pool.query("SELECT 1 FROM train_steps WHERE run_id = $1", [killed])).rowCount, 180_000, 20);
    up.kill("SIGKILL");
    await up.exited;
    // Reconcile found no rollout or reward job missing for the dispatched rounds (queue/queue-watch.ts logs each it adds back).
    expect(up.output()).not.toMatch(/added back/);
    const doneAtKill = await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [killed]);
    expect(doneAtKill.rows[0].n).toBeLessThan(STEPS);
    await runToEnd(killed);

    expect(await trained(killed)).toEqual(plainTrained);
    const plainWeights = await weights(plain);
    expect(plainWeights).toHaveLength(STEPS);
    expect(await weights(killed)).toEqual(plainWeights);
    const replay = spawnRlq(["replay", killed, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  }, 600_000);

  it("the embedded TypeScript trainer runs an SFT run too (its loss is checked in src/trainer/embedded/sft-step.test.ts)", async () => {
    const { runId } = await startRun(w.db, { config: { ...config(), num_rollout: 6, trainer: { kind: "embedded" } } });
    await runToEnd(runId);
    const loss = (await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'loss' ORDER BY step", [runId])).rows.map((r) =>
      Number(r.value),
    );
    expect(loss).toHaveLength(6);
    for (const l of loss) expect(l).toBeGreaterThan(0);
    expect((await trained(runId)).map((s) => s.rows.length)).toEqual(Array.from({ length: 6 }, () => BATCH));
  }, 300_000);
});
