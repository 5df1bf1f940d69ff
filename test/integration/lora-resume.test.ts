import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startTorchTrainer, type Server } from "../../scripts/real-stack.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * A LoRA run (lora_rank 8, peft, workers/trainer-torch/rlq_torch/lora.py) on the fixture HF model
 * (scripts/build-fixture-model.py) whose PyTorch trainer is SIGKILLed in the middle of step 1 and
 * restarted on the same port: the step is retried by a process that rebuilds the policy from
 * hf_checkpoint plus step 0's `adapter/` and reads the adapters' Adam moments from the optimizer file.
 * The run must end exactly as an uninterrupted run with the same seed: the same draws, the same samples
 * trained at each step and none twice, and, at every step, the same adapter, merged weights and
 * optimizer state, byte for byte.
 *
 * The engine is the fake SGLang server (test/fakes/fake-sglang.ts), each run its own: under
 * `deterministic: true` its tokens are a pure function of the seed and the weight version it serves,
 * so two runs sample the same tokens, and it starts in milliseconds where vLLM on the CPU takes minutes.
 * Its ids are bytes (below 258), all inside the fixture model's vocabulary (283); the model's own
 * tokenizer (tokenizer: hf) reads the prompts.
 */
const python = requirePythonModules(["torch", "transformers", "peft"]);
const STEPS = 3;

/** The tensor bytes of a safetensors file: its header names the run, the bytes after it are the tensors. */
function tensorSha256(path: string): string {
  const bytes = readFileSync(path);
  const headerEnd = 8 + Number(bytes.readBigUInt64LE(0));
  return createHash("sha256").update(bytes.subarray(headerEnd)).digest("hex");
}

describe("a LoRA run whose PyTorch trainer is SIGKILLed mid-step", () => {
  let w: World;
  let model = "";
  const trainers: Server[] = [];
  beforeAll(async () => {
    [w, model] = await Promise.all([createWorld("lorakill"), fixtureModel(python)]);
  }, 300_000);
  afterAll(async () => {
    await Promise.all(trainers.map((t) => t.stop(2_000)));
    await w?.close();
  });

  const trainer = async (args: string[]) => {
    const t = await startTorchTrainer(python, ["--threads", "1", ...args]);
    trainers.push(t);
    return t;
  };
  const start = async (trainerUrl: string) =>
    w.start({
      // Each run its own fresh engine: the fake's tokens depend on the version it serves.
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
      trainer: { kind: "remote", url: trainerUrl },
      hf_checkpoint: model,
      tokenizer: "hf",
      lora_rank: 8,
      lora_alpha: 16,
      lr: 1e-3,
      num_rollout: STEPS,
      rollout_max_response_len: 8,
      deterministic: true,
      rollout_shuffle: true,
      weight_sync: "disk",
      train_stall_timeout_s: 120,
    });
  const finish = async (runId: string, up: ReturnType<typeof spawnRlq>, logs: () => string) => {
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([up.exited, new Promise<string>((r) => (timer = setTimeout(() => r("still running after 300 s"), 300_000)))]);
    clearTimeout(timer);
    up.kill("SIGTERM");
    expect(code, `${up.output()}\n${logs()}`).toBe(0);
    const status = (await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status;
    expect(status).toBe("completed");
  };

  const draws = async (runId: string) =>
    (await w.db.pool.query("SELECT draw_ordinal, dataset_index FROM drawn_prompts WHERE run_id = $1 ORDER BY draw_ordinal", [runId])).rows;
  /** Per step: the samples it trained (draw ordinal, sample index) and their tokens. */
  const trained = async (runId: string) =>
    (
      await w.db.pool.query(
        `SELECT trained_step AS step, array_agg(draw_ordinal || ':' || sample_index ORDER BY draw_ordinal, sample_index) AS samples,
                array_agg(array_to_string(tokens, ',') ORDER BY draw_ordinal, sample_index) AS tokens
           FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1`,
        [runId],
      )
    ).rows as Array<{ step: number; samples: string[]; tokens: string[] }>;
  /** Per step: the committed adapter, merged weights and optimizer state, as hashes of their tensor bytes. */
  const checkpoints = async (runId: string) =>
    (await w.db.pool.query("SELECT step, num_samples, checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows.map((r) => {
      const dir = fileURLToPath(String(r.checkpoint_uri));
      return {
        step: r.step as number,
        numSamples: r.num_samples as number,
        adapter: tensorSha256(join(dir, "adapter/adapter_model.safetensors")),
        weights: tensorSha256(join(dir, "weights.safetensors")),
        optimizer: tensorSha256(join(dir, "optimizer.safetensors")),
      };
    });

  it("resumes exactly: the same draws, no sample trained twice, and the uninterrupted run's adapter at every step", async () => {
    const plainTrainer = await trainer([]);
    const plain = await start(plainTrainer.url);
    await finish(plain, spawnRlq(["up", "--run", plain, "--exit-when-done"], w.env), () => plainTrainer.log().slice(-4000));

    // Every step waits in a delay that reports progress (server.py --debug-delay-s), so the kill lands inside step 1.
    const first = await trainer(["--debug-delay-s", "3"]);
    const killed = await start(first.url);
    const up = spawnRlq(["up", "--run", killed, "--exit-when-done"], w.env);
    await waitFor(
      "step 1 inside its train step on the trainer",
      async () => {
        const res = await fetch(`${first.url}/v1/steps/${encodeURIComponent(killed)}/1`);
        return res.ok && ((await res.json()) as { progress?: { phase?: string } }).progress?.phase === "debug_delay";
      },
      240_000,
      50,
    );
    const committed1 = async () => (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1 AND step = 1", [killed])).rows[0].n;
    expect(await committed1()).toBe(0);
    first.child.kill("SIGKILL");
    await waitFor("the killed trainer to exit", async () => first.child.signalCode === "SIGKILL", 30_000, 20);
    expect(first.log()).not.toMatch(new RegExp(`step ${killed}/1 attempt \\S+: done`));
    expect(await committed1()).toBe(0);
    // Restarted on the same port, without the delay: rlq's retry of step 1 finds it there.
    const port = new URL(first.url).port;
    const second = await trainer(["--port", port]);
    await finish(killed, up, () => `--- trainer (killed) ---\n${first.log().slice(-4000)}\n--- trainer ---\n${second.log().slice(-4000)}`);
    // The restarted process trained step 1 from step 0's checkpoint, and step 0 only once, before the kill.
    expect(second.log()).toMatch(new RegExp(`step ${killed}/1 attempt \\S+: done`));
    expect(second.log()).not.toMatch(new RegExp(`step ${killed}/0 attempt`));

    expect(await draws(killed)).toEqual(await draws(plain));
    const plainTrained = await trained(plain);
    expect(plainTrained.map((s) => s.step)).toEqual([0, 1, 2]);
    expect(await trained(killed)).toEqual(plainTrained);
    const plainCkpts = await checkpoints(plain);
    const killedCkpts = await checkpoints(killed);
    // No sample trained twice: each step's count is the samples that name it, and the rows are one per sample.
    for (const [i, c] of killedCkpts.entries()) expect(c.numSamples).toBe(plainTrained[i]?.samples.length);
    expect(killedCkpts).toEqual(plainCkpts);
    // The adapters moved: the steps' checkpoints differ from one another.
    expect(new Set(plainCkpts.map((c) => c.adapter)).size).toBe(STEPS);
    const replay = spawnRlq(["replay", killed, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  }, 900_000);
});
