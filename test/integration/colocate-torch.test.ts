/**
 * Colocated mode (colocate: true, core/colocate.ts) with the real PyTorch trainer: the fixture HF
 * model (scripts/build-fixture-model.py) trained by workers/trainer-torch on two ranks with FSDP2
 * (torchrun, gloo), which offloads what it holds after each step and onloads it before the next
 * (rlq_torch/offload.py), against the fake SGLang server as the engine. The engine is a fake because
 * vLLM's CPU build has no sleep mode (vllm/platforms/interface.py is_sleep_mode_available: CUDA,
 * ROCm and XPU only) and SGLang has no CPU build here; the fake releases and resumes its memory as
 * SGLang's scheduler does (test/fakes/sglang/weights.ts) and counts every call the real one would
 * die on. Its token ids are bytes (below 258), inside the fixture model's vocabulary (283), and the
 * model's own tokenizer (tokenizer: hf) reads the prompts.
 *
 * The controller (`rlq up --workers ''`) is SIGKILLed once in each phase, released, training,
 * pushing and resuming, two of them between an endpoint call and its decision; the trainer's whole
 * process group is SIGKILLed inside step 1's training (after its onload) and restarted on its port,
 * where the step is retried from step 0's checkpoint. The run must complete with every durability
 * invariant, `rlq replay --check` clean, the phases in order in the log, the offload and onload in
 * each step's metrics, and no generation, load or resume the engine could not take.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startTorchTrainer, type Server } from "../../scripts/real-stack.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { colocateCrashPoints, expectColocatedPhases } from "../helpers/colocate.ts";
import { keepRestarting, spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

const python = requirePythonModules(["torch", "transformers"]);
const NUM_ROLLOUT = 3;
/** The step whose training the trainer's kill interrupts. */
const KILLED_STEP = 1;
const trainerArgs = ["--threads", "1", "--nproc", "2", "--sharding", "fsdp"];

/** SIGKILL a server's whole process group (torchrun's ranks with it), as a crash would. */
function killGroup(s: Server): void {
  try {
    process.kill(-(s.child.pid as number), "SIGKILL");
  } catch {
    // the group is gone already
  }
}

describe("colocated mode on the real PyTorch trainer (FSDP2, 2 ranks)", () => {
  let w: World;
  let model = "";
  const trainers: Server[] = [];
  beforeAll(async () => {
    [w, model] = await Promise.all([createWorld("colotorch", { engineArgs: ["--token-delay-ms", "2"] }), fixtureModel(python)]);
  }, 300_000);
  afterAll(async () => {
    await Promise.all(trainers.map((t) => t.stop(2_000)));
    await w?.close();
  });

  it("offloads between steps and completes exactly with a SIGKILL of the controller in each phase and of the trainer mid-step", async () => {
    // Each rank sleeps at each training progress report, so the kill below lands inside step 1's training.
    const first = await startTorchTrainer(python, [...trainerArgs, "--debug-rank-delay-s", "1"]);
    trainers.push(first);
    const engineUrl = await w.freshEngine();
    const runId = await w.start({
      colocate: true,
      num_rollout: NUM_ROLLOUT,
      partial_rollout: true,
      rollout_shuffle: true,
      rollout_max_response_len: 8,
      engine: { kind: "sglang", urls: [engineUrl] },
      trainer: { kind: "remote", url: first.url },
      hf_checkpoint: model,
      tokenizer: "hf",
      lr: 1e-3,
      // A KL term: the trainer holds a reference policy (hf_checkpoint) that it offloads too.
      use_kl_loss: true,
      kl_loss_coef: 0.01,
      weight_sync: "disk",
      train_stall_timeout_s: 120,
    });
    const marks = colocateCrashPoints.map((_, i) => join(w.home, `colotorch-crash-${i}`));
    const upEnv = { ...w.env, RLQ_CRASH_AT: colocateCrashPoints.map(([p], i) => `${p}:once=${marks[i]}`).join(",") };
    // A controller only: its kills take no job with them, the worker below runs every one.
    const up = keepRestarting(() => spawnRlq(["up", "--run", runId, "--workers", ""], upEnv));
    const worker = spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "8"], w.env);
    const committed = async () => (await w.db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0]?.n;
    const alive = () => {
      up.check();
      if (worker.child.exitCode !== null) throw new Error(`the worker exited (${worker.child.exitCode}):\n${worker.output().slice(-4000)}`);
    };
    let second: Server | undefined;
    const logs = () =>
      `--- up ---\n${up.current().output().slice(-3000)}\n--- worker ---\n${worker.output().slice(-3000)}\n--- trainer (first) ---\n${first.log().slice(-3000)}\n--- trainer (second) ---\n${second?.log().slice(-3000) ?? ""}`;
    try {
      await waitFor(
        `step ${KILLED_STEP} inside its training on the trainer`,
        async () => {
          alive();
          const res = await fetch(`${first.url}/v1/steps/${encodeURIComponent(runId)}/${KILLED_STEP}`).catch(() => null);
          return res?.ok === true && /^(old_logprobs|train) /.test(((await res.json()) as { progress?: { phase?: string } }).progress?.phase ?? "");
        },
        240_000,
        20,
      );
      killGroup(first);
      await waitFor("the killed trainer to exit", async () => first.child.signalCode !== null || first.child.exitCode !== null, 30_000, 20);
      expect(await committed()).toBe(KILLED_STEP);
      second = await startTorchTrainer(python, [...trainerArgs, "--port", new URL(first.url).port]);
      trainers.push(second);
      await waitFor(
        "the colocated run to complete",
        async () => {
          alive();
          const r = await w.db.pool.query<{ status: string; last_error: string | null }>("SELECT status, last_error FROM runs WHERE id = $1", [runId]);
          if (r.rows[0]?.status === "paused") throw new Error(`run paused: ${r.rows[0].last_error}\n${logs()}`);
          return r.rows[0]?.status === "completed";
        },
        240_000,
        250,
      );
    } catch (e) {
      throw new Error(`${String(e)}\n${logs()}`, { cause: e });
    } finally {
      up.current().kill("SIGTERM");
      worker.kill("SIGTERM");
      await Promise.all([up.current().exited, worker.exited]);
    }
    colocateCrashPoints.forEach(([point], i) => expect(existsSync(marks[i] as string), point).toBe(true));
    expect(up.restarts()).toBe(colocateCrashPoints.length);
    // The killed step was trained by the second trainer only, and no earlier step again.
    expect(first.log()).not.toMatch(new RegExp(`step ${runId}/${KILLED_STEP} attempt \\S+: done`));
    expect(second?.log()).toMatch(new RegExp(`step ${runId}/${KILLED_STEP} attempt \\S+: done`));
    for (let s = 0; s < KILLED_STEP; s++) expect(second?.log()).not.toMatch(new RegExp(`step ${runId}/${s} attempt`));

    await checkRunInvariants(w.db, runId, { numRollout: NUM_ROLLOUT, datasetSize: 64, shuffle: true, seed: 42, rbs: 4 });
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);

    await expectColocatedPhases(w.db, runId, NUM_ROLLOUT);

    // The trainer's moves (rlq_torch/offload.py), as each step reported them, bytes summed over the
    // ranks: every step ends offloaded, the same state each time (the policy's shards, its buffers
    // and Adam moments, the reference policy). A step onloads what the step before offloaded in the
    // same process; step 0 and the retried step start in a process that holds nothing, so they
    // onload nothing and load from disk.
    const moves = (
      await w.db.pool.query<{ step: number; key: string; value: number }>(
        "SELECT step, key, value FROM train_metrics WHERE run_id = $1 AND key IN ('offload_bytes', 'onload_bytes') ORDER BY step, key",
        [runId],
      )
    ).rows;
    const at = (step: number, key: string) => moves.find((m) => m.step === step && m.key === key)?.value;
    const offloaded = at(0, "offload_bytes") ?? 0;
    console.log(
      `colocate-torch: trainer killed in step ${KILLED_STEP}; per step [offload, onload] bytes ${JSON.stringify([...Array(NUM_ROLLOUT).keys()].map((s) => [at(s, "offload_bytes"), at(s, "onload_bytes")]))}`,
    );
    expect(offloaded, JSON.stringify(moves)).toBeGreaterThan(0);
    for (let step = 0; step < NUM_ROLLOUT; step++) {
      expect(at(step, "offload_bytes"), `step ${step} offload_bytes`).toBe(offloaded);
      const restored = step === 0 || step === KILLED_STEP ? 0 : offloaded;
      expect(at(step, "onload_bytes"), `step ${step} onload_bytes`).toBe(restored);
    }

    // The engine was asked for nothing it could not take: no generation or load while released, no
    // release while requests ran, no resume of memory it held.
    const stats = (await (await fetch(`${engineUrl}/stats`)).json()) as {
      releases: number;
      resumes: number;
      memoryFaults: string[];
      generateWhileReleased: number;
      healthWhileReleased: number;
      loadWhileReleased: number;
      abortAlls: number;
      unauthorized: number;
      loadedPaths: string[];
    };
    expect(stats.memoryFaults).toEqual([]);
    expect([stats.generateWhileReleased, stats.healthWhileReleased, stats.loadWhileReleased, stats.abortAlls, stats.unauthorized]).toEqual([0, 0, 0, 0, 0]);
    expect(stats.releases).toBeGreaterThanOrEqual(NUM_ROLLOUT + 1);
    expect(stats.resumes).toBe(2 * NUM_ROLLOUT + 1);
    // The engine loaded the trainer's committed checkpoints, each step's once (a restarted controller
    // loads nothing into released engines), in order, each a directory the trainer wrote whole.
    const checkpoints = (
      await w.db.pool.query<{ checkpoint_uri: string }>("SELECT checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])
    ).rows.map((r) => fileURLToPath(r.checkpoint_uri));
    expect(stats.loadedPaths).toEqual(checkpoints);
    for (const dir of checkpoints) expect(existsSync(join(dir, "weights.safetensors")), dir).toBe(true);
  }, 600_000);
});
