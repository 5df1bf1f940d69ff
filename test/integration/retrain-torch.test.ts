import { spawn } from "node:child_process";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";

/**
 * `rlq retrain` against the PyTorch trainer (workers/trainer-torch) behind the trainer
 * protocol: a deterministic demo run's step replayed into the trainer reproduces the
 * committed tensors. The trainer gets a distinct run id (it answers a (run_id, step) it
 * has seen with its earlier checkpoint), so the comparison is on the tensor bytes.
 * Runs in rlq's Python environment (test/helpers/python.ts).
 */
const MODEL = { vocab_size: 258, context_length: 64, d_model: 32, n_heads: 4, n_layers: 2, d_mlp: 64 };
const python = requirePythonModules(["torch", "numpy"]);

describe("rlq retrain with the PyTorch trainer", () => {
  let w: World;
  let kill: (() => void) | undefined;
  beforeAll(async () => {
    w = await createWorld("retraintorch", { engineArgs: ["--token-delay-ms", "0"] });
  });
  afterAll(async () => {
    kill?.();
    await w?.close();
  });

  it("reproduces a deterministic step's committed tensors", async () => {
    const child = spawn(
      python,
      [join(repoRoot, "workers/trainer-torch/server.py"), "--port", "0", "--device", "cpu", "--threads", "1", "--model-config", JSON.stringify(MODEL)],
      { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] },
    );
    kill = () => child.kill("SIGKILL");
    let err = "";
    child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-50_000)));
    const port = await new Promise<number>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
        const m = /listening (\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      child.on("exit", (c) => reject(new Error(`trainer exited (${c}) before listening: ${err}`)));
    });
    const { runId } = await startRun(w.db, {
      config: join(repoRoot, "examples/demo.yaml"),
      set: ["num_rollout=2", "rollout_batch_size=8", "deterministic=true", `trainer={kind: remote, url: 'http://127.0.0.1:${port}'}`],
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${err}`).toBe(0);
    const committed = (await w.db.pool.query("SELECT checkpoint_sha256 FROM train_steps WHERE run_id = $1 AND step = 1", [runId])).rows[0]
      .checkpoint_sha256 as string;
    const retrain = spawnRlq(["retrain", runId, "--step", "1"], w.env);
    expect(await retrain.exited, `${retrain.output()}\n--- trainer ---\n${err}`).toBe(0);
    expect(retrain.output()).toMatch(
      new RegExp(`weights sha256 [0-9a-f]{64} (== committed ${committed}$|!= committed ${committed} {2}\\(same tensors; the header differs\\))`, "m"),
    );
  });
});
