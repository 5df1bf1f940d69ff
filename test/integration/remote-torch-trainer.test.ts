import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readCheckpoint } from "../../src/model/checkpoint.ts";
import { startRun } from "../../src/api.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * A short run trained by the reference PyTorch trainer (workers/trainer-torch/server.py,
 * --device cpu) through rlq's trainer protocol, with a SIGKILL of the trainer process in
 * the middle of a train step and a restart on the same port: the step is retried (a new
 * attempt, weights and Adam state reloaded from the committed checkpoint) and commits once.
 *
 * The fake SGLang engine speaks byte tokens (vocab 258: bytes, BOS 256, EOS 257), so the
 * trainer trains the embedded model architecture with vocab 258, initialised from the run's
 * seed (checkpoint_uri_in null at version 0; the model config is the server's --model-config).
 *
 * Needs a Python that imports torch: $RLQ_PYTHON, else python3, else /usr/bin/python3
 * (Debian's python3-torch installs for the system interpreter). Skipped, saying so, without one.
 */
const MODEL = { vocab_size: 258, context_length: 64, d_model: 32, n_heads: 4, n_layers: 2, d_mlp: 64 };
const SERVER = join(repoRoot, "workers/trainer-torch/server.py");

const python = requirePythonModules(["torch", "numpy"]);

interface PyTrainer {
  child: ChildProcess;
  port: number;
  log(): string;
  exited: Promise<number | string>;
}

const startedTrainers: PyTrainer[] = [];

async function startTrainer(py: string, port: number, extra: string[] = []): Promise<PyTrainer> {
  const child = spawn(py, [SERVER, "--port", String(port), "--device", "cpu", "--threads", "1", "--model-config", JSON.stringify(MODEL), ...extra], {
    cwd: repoRoot,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout?.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr?.on("data", (d: Buffer) => {
    err += d.toString();
    if (err.length > 200_000) err = err.slice(-100_000);
  });
  const exited = new Promise<number | string>((resolve) => child.on("exit", (code, sig) => resolve(code ?? sig ?? -1)));
  const bound = await new Promise<number>((resolve, reject) => {
    const onData = () => {
      const m = /listening (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    };
    child.stdout?.on("data", onData);
    void exited.then((c) => reject(new Error(`trainer exited (${c}) before listening: ${err}`)));
  });
  const t = { child, port: bound, log: () => err, exited };
  startedTrainers.push(t);
  return t;
}

describe("the PyTorch trainer behind the trainer protocol", () => {
  let w: World;
  const started = startedTrainers; // every trainer process, so none outlives the file (a test's last one is replaced by the next test's)
  beforeAll(async () => {
    w = await createWorld("torchtrainer", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    for (const t of started) if (t.child.exitCode === null && t.child.signalCode === null) t.child.kill("SIGKILL");
    await w?.close();
  });

  it("trains a run on CPU; a SIGKILL mid-step is retried and the step commits once", async () => {
    const py = python;
    // Every step waits 2 s (reporting progress) before training, so the kill lands mid-step.
    const first = await startTrainer(py, 0, ["--debug-delay-s", "2"]);
    const url = `http://127.0.0.1:${first.port}`;
    // Default train_max_attempts (3): the killed attempt is one; the wait for the restarted trainer uses none.
    const runId = await w.start({ trainer: { kind: "remote", url }, num_rollout: 3, lr: 1e-3, train_stall_timeout_s: 30 });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    try {
      // Step 1 reaches the trainer: kill it in the middle of that step.
      await waitFor("step 1 to start on the trainer", async () => new RegExp(`step ${runId}/1 attempt \\S+: queued`).test(first.log()), 120_000, 50);
      // ... and is in its delay (reporting progress), not still queued.
      await waitFor(
        "step 1 in its delay on the trainer",
        async () => {
          const res = await fetch(`${url}/v1/steps/${encodeURIComponent(runId)}/1`);
          return res.ok && ((await res.json()) as { progress?: { phase?: string } }).progress?.phase === "debug_delay";
        },
        120_000,
        50,
      );
      const committed = async (step: number) =>
        (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1 AND step = $2", [runId, step])).rows[0].n as number;
      expect(await committed(1)).toBe(0);
      first.child.kill("SIGKILL");
      expect(await first.exited).toBe("SIGKILL");
      expect(first.log()).not.toMatch(new RegExp(`step ${runId}/1 attempt \\S+: done`));
      expect(await committed(1)).toBe(0);

      // Restart on the same port (no delay): rlq's retry finds it there.
      const second = await startTrainer(py, first.port);
      expect(await up.exited, `${up.output()}\n--- trainer (killed) ---\n${first.log()}\n--- trainer ---\n${second.log()}`).toBe(0);

      // Exactly one committed row per step, versions chained.
      const steps = await w.db.pool.query(
        "SELECT step, attempt, weight_version_in, weight_version_out, checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step",
        [runId],
      );
      expect(steps.rows.map((r) => [r.step, r.weight_version_in, r.weight_version_out])).toEqual([
        [0, 0, 1],
        [1, 1, 2],
        [2, 2, 3],
      ]);
      // Step 1 committed a retried attempt (the first attempt, number 0, died with the trainer),
      // trained by the restarted process, which reloaded version 1 from step 0's checkpoint.
      const step1 = steps.rows[1];
      expect(String(step1.attempt)).not.toMatch(/^0-/);
      // The protocol's attempt is rlq's attempt number; the directory adds a random suffix.
      expect(second.log()).toMatch(new RegExp(`step ${runId}/1 attempt ${String(step1.attempt).split("-")[0]}: done`));
      expect(second.log()).not.toMatch(new RegExp(`step ${runId}/0 attempt`)); // step 0 was committed before the kill
      for (const row of steps.rows) {
        const dir = fileURLToPath(String(row.checkpoint_uri));
        // The losing attempts' directories are gone; the committed one holds rlq's checkpoint format.
        expect(readdirSync(join(dir, "..")).filter((e) => e.startsWith("attempt-"))).toEqual([dir.split("/").pop()]);
        expect(readdirSync(dir).sort()).toEqual(["optimizer.safetensors", "weights.safetensors"]);
        const ckpt = await readCheckpoint(String(row.checkpoint_uri));
        expect(ckpt.version).toBe(row.weight_version_out);
        expect(ckpt.runId).toBe(runId);
        expect(ckpt.config.vocab_size).toBe(258);
        const metrics = await w.db.pool.query("SELECT key FROM train_metrics WHERE run_id = $1 AND step = $2", [runId, row.step]);
        expect(metrics.rows.map((r) => r.key)).toEqual(
          expect.arrayContaining([
            "pg_loss",
            "entropy_loss",
            "grad_norm",
            "train_rollout_logprob_abs_diff",
            "step_s",
            "fwd_bwd_s",
            "optimizer_s",
            "save_s",
            "old_logprobs_s",
            "tokens_per_s",
            "tflops",
            "model_flops_per_step",
          ]),
        );
      }
      await waitFor(
        "the run to complete",
        async () => (await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status === "completed",
        10_000,
      );
    } finally {
      up.kill("SIGTERM");
    }
  });

  it("trains the demo config (embedded ONNX engine, rlq's warm start) through a SIGKILL mid-step", async () => {
    const py = python;
    const first = await startTrainer(py, 0, ["--debug-delay-s", "2"]);
    const url = `http://127.0.0.1:${first.port}`;
    // The default train_max_attempts: the train job waits for the new trainer (Python and torch import
    // take seconds) without spending attempts (trainer_unreachable_timeout_s).
    const { runId } = await startRun(w.db, { config: join(repoRoot, "examples/demo.yaml"), set: ["num_rollout=3", `trainer={kind: remote, url: '${url}'}`] });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    try {
      await waitFor("step 1 to start on the trainer", async () => new RegExp(`step ${runId}/1 attempt \\S+: queued`).test(first.log()), 120_000, 50);
      first.child.kill("SIGKILL");
      expect(await first.exited).toBe("SIGKILL");
      const second = await startTrainer(py, first.port);
      // Bounded, so a stuck run fails with what rlq and both trainers said instead of the test's timeout.
      let timer: NodeJS.Timeout | undefined;
      const code = await Promise.race([up.exited, new Promise<string>((r) => (timer = setTimeout(() => r("still running after 100 s"), 100_000)))]);
      clearTimeout(timer);
      expect(code, `${up.output()}\n--- trainer (killed) ---\n${first.log()}\n--- trainer ---\n${second.log()}`).toBe(0);
      const steps = (await w.db.pool.query("SELECT step, weight_version_out, num_samples FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
      expect(steps).toEqual([0, 1, 2].map((st) => ({ step: st, weight_version_out: st + 1, num_samples: 256 })));
      // The ONNX engine generated from the PyTorch trainer's checkpoints: versions 0..2 in the samples,
      // and the two implementations agree on the log-probs (float32 both sides).
      const versions = (await w.db.pool.query("SELECT DISTINCT weight_version FROM sample_segments WHERE run_id = $1 ORDER BY 1", [runId])).rows.map(
        (r) => r.weight_version,
      );
      expect(versions).toEqual([0, 1, 2]);
      const diff = (await w.db.pool.query("SELECT max(value) AS v FROM train_metrics WHERE run_id = $1 AND key = 'train_rollout_logprob_abs_diff'", [runId]))
        .rows[0].v;
      expect(diff).toBeLessThan(1e-4);
    } finally {
      up.kill("SIGTERM");
    }
  });
});
