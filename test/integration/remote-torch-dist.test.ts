import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readCheckpoint } from "../../src/model/checkpoint.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * A run trained by the PyTorch trainer on two ranks (server.py --nproc 2: torchrun, gloo on
 * CPU), with one rank SIGKILLed in the middle of a train step. The trainer process (the front)
 * stays up: the step fails with a retryable `internal` error ("the process group failed"), rlq
 * retries it as a new attempt, a fresh group reloads the committed input checkpoint and trains
 * it, and the step commits exactly once.
 *
 * Fake SGLang engine with byte tokens (vocab 258), the embedded model architecture initialised
 * from the run's seed, as remote-torch-trainer.test.ts. Needs a Python that imports torch with
 * torch.distributed (gloo); skipped, saying so, without one.
 */
const MODEL = { vocab_size: 258, context_length: 64, d_model: 32, n_heads: 4, n_layers: 2, d_mlp: 64 };
const SERVER = join(repoRoot, "workers/trainer-torch/server.py");

const python = requirePythonModules(["torch", "numpy", "torch.distributed"]);

describe("the PyTorch trainer on two ranks", () => {
  let w: World;
  let child: ChildProcess | undefined;
  let log = "";
  beforeAll(async () => {
    w = await createWorld("torchdist", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    if (child && child.exitCode === null) {
      child.kill("SIGTERM"); // the front stops its torchrun group on SIGTERM
      await new Promise((r) => child?.once("exit", r));
    }
    await w?.close();
  });

  it("a rank killed mid-step fails the attempt retriably; the retry trains on a new group and the step commits once", async () => {
    child = spawn(
      python,
      [SERVER, "--port", "0", "--device", "cpu", "--threads", "1", "--nproc", "2", "--debug-rank-delay-s", "0.3", "--model-config", JSON.stringify(MODEL)],
      {
        cwd: repoRoot,
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    child.stderr?.on("data", (d: Buffer) => {
      log += d.toString();
      if (log.length > 400_000) log = log.slice(-200_000);
    });
    const port = await new Promise<number>((resolve, reject) => {
      let out = "";
      child?.stdout?.on("data", (d: Buffer) => {
        out += d.toString();
        const m = /listening (\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      child?.on("exit", (c) => reject(new Error(`trainer exited (${c}) before listening: ${log}`)));
    });
    const url = `http://127.0.0.1:${port}`;
    const runId = await w.start({ trainer: { kind: "remote", url }, num_rollout: 3, lr: 1e-3, max_tokens_per_gpu: 200, train_stall_timeout_s: 60 });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    try {
      const health = async () => (await (await fetch(`${url}/v1/health`)).json()) as { distributed: { ranks: Array<{ rank: number; pid: number }> } };
      const status = async () => (await (await fetch(`${url}/v1/steps/${runId}/1`)).json()) as { state?: string; progress?: { phase: string } };
      await waitFor("step 1 to be training on the ranks", async () => /^train/.test((await status()).progress?.phase ?? ""), 180_000, 20);
      const committed = async (step: number) =>
        (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1 AND step = $2", [runId, step])).rows[0].n as number;
      expect(await committed(1)).toBe(0);
      const ranks = (await health()).distributed.ranks;
      expect(ranks.map((r) => r.rank)).toEqual([0, 1]);
      process.kill((ranks[1] as { pid: number }).pid, "SIGKILL");

      let timer: NodeJS.Timeout | undefined;
      const code = await Promise.race([up.exited, new Promise<string>((r) => (timer = setTimeout(() => r("still running after 200 s"), 200_000)))]);
      clearTimeout(timer);
      expect(code, `${up.output()}\n--- trainer ---\n${log}`).toBe(0);
      expect(child.exitCode).toBeNull(); // the front survived the group's failure
      expect(log).toMatch(new RegExp(`step ${runId}/1 attempt 0: failed internal: .*process group failed`));

      const steps = (
        await w.db.pool.query("SELECT step, attempt, weight_version_in, weight_version_out, checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [
          runId,
        ])
      ).rows;
      expect(steps.map((r) => [r.step, r.weight_version_in, r.weight_version_out])).toEqual([
        [0, 0, 1],
        [1, 1, 2],
        [2, 2, 3],
      ]);
      expect(String(steps[1].attempt)).not.toMatch(/^0-/); // the killed attempt (0) never committed
      for (const row of steps) {
        const dir = fileURLToPath(String(row.checkpoint_uri));
        expect(readdirSync(join(dir, "..")).filter((e) => e.startsWith("attempt-"))).toEqual([dir.split("/").pop()]);
        expect(readdirSync(dir).sort()).toEqual(["optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors", "weights.safetensors"]);
        const ckpt = await readCheckpoint(String(row.checkpoint_uri));
        expect(ckpt.version).toBe(row.weight_version_out);
      }
    } finally {
      up.kill("SIGTERM");
    }
  }, 420_000);
});
