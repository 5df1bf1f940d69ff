/**
 * On-policy distillation from an SFT-trained teacher to a weaker student, on the demo task.
 *
 * 1. An SFT run (loss_type sft_loss, docs/sft.md), as bench/sft-learning.ts runs it: a random-init
 *    model of the demo's architecture trained on the train split's solutions by the PyTorch trainer
 *    (workers/trainer-torch/server.py --device cpu) for --sft-steps steps. Its last checkpoint is the
 *    teacher; its checkpoint after --student-step steps, the same model trained less, is the student.
 * 2. OPD with zero reward (pure distillation, use_opd, opd_kl_coef; the advantage is slime's
 *    A_t − coef·(log π_student − log π_teacher), docs/algorithms.md) by the embedded trainer's train
 *    step, --opd-steps steps of 16 train prompts × 4 samples drawn from the student at temperature 1,
 *    the teacher scoring every sampled token.
 *
 * Measured on the held-out split (examples/demo/eval.jsonl, 256 prompts the train split lacks), before
 * and after OPD, and for the teacher: the exact reverse KL(π_student ‖ π_teacher), summed over the
 * vocabulary and averaged over the positions of one temperature-1 student sample per prompt; the
 * task reward as the exact probability that a temperature-1 sample is the right answer (the product of
 * the answer tokens' probabilities: the expected reward of an RL sample), and the greedy solve rate
 * graded by the demo's exact match. Writes bench/results/opd-teacher-student.json. Needs Postgres and Redis.
 *
 *   npx tsx bench/opd-teacher-student.ts [--sft-steps 500] [--student-step 150] [--opd-steps 60] [--lr 0.0005] [--coef 1] [--sft-dir DIR]
 */
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { exactBoxedReward, formatAnswer } from "../examples/demo/task.ts";
import { startRun } from "../src/api.ts";
import { readCheckpoint, writeCheckpoint } from "../src/model/checkpoint.ts";
import { parseModelConfig } from "../src/model/config.ts";
import { Prng } from "../src/model/prng.ts";
import { logSoftmax, referenceForward } from "../src/model/reference-forward.ts";
import { createDemoTokenizer } from "../src/model/tokenizer.ts";
import { initWeights, type Weights } from "../src/model/weights.ts";
import { createJaxModel, type JaxModel } from "../src/trainer/embedded/jax-model.ts";
import { runEmbeddedTrainStep, type TrainStepDeps } from "../src/trainer/embedded/train-step.ts";
import { makeTrainRequest } from "../src/trainer/embedded/testing.ts";
import type { TrainSample } from "../src/trainer/trainer.ts";
import setupServices from "../test/helpers/global-setup.ts";
import { createDemoWorld } from "../test/helpers/demo-runs.ts";
import { repoRoot, spawnRlq } from "../test/helpers/processes.ts";
import { rlqPython } from "../test/helpers/python.ts";
import { writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    "sft-steps": { type: "string", default: "500" },
    "student-step": { type: "string", default: "150" },
    "opd-steps": { type: "string", default: "60" },
    lr: { type: "string", default: "0.0005" },
    coef: { type: "string", default: "1" },
    seed: { type: "string", default: "7" },
    "sft-dir": { type: "string" },
  },
});
const sftSteps = Number(values["sft-steps"]);
const studentStep = Number(values["student-step"]);
const opdSteps = Number(values["opd-steps"]);
const lr = Number(values.lr);
const coef = Number(values.coef);
const seed = Number(values.seed);
const MODEL = { vocab_size: 24, context_length: 32, d_model: 64, n_heads: 4, n_layers: 2, d_mlp: 256, layer_norm_eps: 1e-5 };
const config = parseModelConfig(MODEL);
const tok = createDemoTokenizer();
const MAX_RESPONSE = 8;

const readRows = (file: string) =>
  readFileSync(join(repoRoot, file), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as { input: string; label: string });
const trainRows = readRows("examples/demo/train.jsonl");
const heldOut = readRows("examples/demo/eval.jsonl");

/** Phase 1: the SFT run; the weights after `studentStep` steps and after the last one. */
async function sftTeacherAndStudent(): Promise<{ teacher: Weights; student: Weights; loss: number[] }> {
  await setupServices();
  const dir = mkdtempSync(join(tmpdir(), "rlq-opd-bench-"));
  const init = join(dir, "random-init");
  await writeCheckpoint(init, { config, weights: initWeights(config, seed), version: 0, runId: "sft-random-init", step: -1 });
  copyFileSync(join(repoRoot, "examples/demo/tokenizer.json"), join(dir, "tokenizer.json"));
  const data = join(dir, "sft-train.jsonl");
  writeFileSync(data, trainRows.map((r) => JSON.stringify({ input: r.input, response: formatAnswer(r.label) })).join("\n") + "\n");
  const trainer = spawn(rlqPython(), [join(repoRoot, "workers/trainer-torch/server.py"), "--port", "0", "--device", "cpu", "--threads", "1"], {
    cwd: repoRoot,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let trainerLog = "";
  trainer.stderr.on("data", (d: Buffer) => (trainerLog = (trainerLog + d.toString()).slice(-20_000)));
  const port = await new Promise<number>((resolve, reject) => {
    let out = "";
    trainer.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /listening (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    trainer.on("exit", (c) => reject(new Error(`trainer exited (${c}) before listening: ${trainerLog}`)));
  });
  const w = await createDemoWorld("bopd");
  try {
    // bench/sft-learning.ts's run, without its evals (measured here instead).
    const { runId } = await startRun(w.db, {
      config: {
        prompt_data: data,
        label_key: "response",
        loss_type: "sft_loss",
        tokenizer: "model",
        ref_load: init,
        rm_type: "math",
        rollout_batch_size: 128,
        n_samples_per_prompt: 1,
        num_rollout: sftSteps,
        rollout_max_response_len: MAX_RESPONSE,
        rollout_stop_token_ids: [2],
        rollout_shuffle: true,
        calculate_per_token_loss: true,
        lr: 3e-3,
        lr_warmup_iters: 100,
        adam_beta2: 0.99,
        weight_decay: 0.01,
        update_weights_interval: sftSteps,
        engine: { kind: "embedded" },
        trainer: { kind: "remote", url: `http://127.0.0.1:${port}` },
      },
      name: "opd-teacher-sft",
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const code = await up.exited;
    if (code !== 0) throw new Error(`rlq up exited ${code}:\n${up.output().slice(-4000)}\n--- trainer ---\n${trainerLog}`);
    const at = async (step: number) => {
      const r = await w.db.pool.query("SELECT checkpoint_uri FROM train_steps WHERE run_id = $1 AND step = $2", [runId, step]);
      return (await readCheckpoint(fileURLToPath(String(r.rows[0].checkpoint_uri)))).weights;
    };
    const loss = (await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'loss' ORDER BY step", [runId])).rows.map((r) =>
      Number(r.value),
    );
    return { teacher: await at(sftSteps - 1), student: await at(studentStep - 1), loss };
  } finally {
    trainer.kill("SIGKILL");
    await w.close();
  }
}

/** Each response position's log-prob row (temperature 1) of `tokens` after `promptLength`. */
function rowsOf(weights: Weights, tokens: readonly number[], promptLength: number): Float64Array[] {
  return referenceForward(config, weights, tokens)
    .slice(promptLength - 1, tokens.length - 1)
    .map((r) => logSoftmax(r));
}

/** A response from `weights`: sampled at temperature 1 (rng) or greedy (null), up to EOS or MAX_RESPONSE tokens. */
function generate(weights: Weights, prompt: readonly number[], rng: Prng | null): number[] {
  const tokens = [...prompt];
  for (let t = 0; t < MAX_RESPONSE; t++) {
    const rows = referenceForward(config, weights, tokens);
    const lp = logSoftmax(rows[rows.length - 1] as Float64Array);
    let pick = 0;
    if (rng === null) {
      for (let i = 1; i < lp.length; i++) if ((lp[i] as number) > (lp[pick] as number)) pick = i;
    } else {
      let u = rng.nextFloat();
      pick = lp.length - 1;
      for (let i = 0; i < lp.length; i++) {
        u -= Math.exp(lp[i] as number);
        if (u <= 0) {
          pick = i;
          break;
        }
      }
    }
    tokens.push(pick);
    if (pick === tok.eosId) break;
  }
  return tokens.slice(prompt.length);
}

interface Measures {
  reverse_kl: number;
  expected_solve_rate: number;
  greedy_solve_rate: number;
}

/** The held-out measures of `student` against `teacher` (see the file comment). */
function measure(student: Weights, teacher: Weights): Measures {
  const rng = new Prng(999);
  let kl = 0;
  let positions = 0;
  let expected = 0;
  let greedy = 0;
  for (const r of heldOut) {
    const prompt = tok.formatPrompt(r.input);
    const sampled = [...prompt, ...generate(student, prompt, rng)];
    const s = rowsOf(student, sampled, prompt.length);
    const t = rowsOf(teacher, sampled, prompt.length);
    s.forEach((row, i) => {
      const te = t[i] as Float64Array;
      for (let v = 0; v < row.length; v++) kl += Math.exp(row[v] as number) * ((row[v] as number) - (te[v] as number));
      positions++;
    });
    const answer = [...tok.encode(formatAnswer(r.label)), tok.eosId];
    const full = [...prompt, ...answer];
    expected += Math.exp(rowsOf(student, full, prompt.length).reduce((a, row, i) => a + (row[answer[i] as number] as number), 0));
    greedy += exactBoxedReward(tok.decode(generate(student, prompt, null)), r.label);
  }
  const n = heldOut.length;
  return { reverse_kl: kl / positions, expected_solve_rate: expected / n, greedy_solve_rate: greedy / n };
}

/**
 * --sft-dir DIR: the SFT phase's teacher and student are kept in DIR (rlq checkpoints) and read back by a
 * later run with the same DIR, which then measures OPD alone (other --lr, --coef, --opd-steps).
 */
async function teacherAndStudent(): Promise<{ teacher: Weights; student: Weights; loss: number[] }> {
  const dir = values["sft-dir"];
  if (dir !== undefined && existsSync(join(dir, "sft.json"))) {
    const loss = (JSON.parse(readFileSync(join(dir, "sft.json"), "utf8")) as { loss: number[] }).loss;
    return { teacher: (await readCheckpoint(join(dir, "teacher"))).weights, student: (await readCheckpoint(join(dir, "student"))).weights, loss };
  }
  const out = await sftTeacherAndStudent();
  if (dir !== undefined) {
    await writeCheckpoint(join(dir, "teacher"), { config, weights: out.teacher, version: sftSteps, runId: "opd-teacher", step: sftSteps - 1 });
    await writeCheckpoint(join(dir, "student"), { config, weights: out.student, version: studentStep, runId: "opd-student", step: studentStep - 1 });
    writeFileSync(join(dir, "sft.json"), JSON.stringify({ sftSteps, studentStep, seed, loss: out.loss }));
  }
  return out;
}

const t0 = Date.now();
const { teacher, student: studentInit, loss } = await teacherAndStudent();
const sftWallS = (Date.now() - t0) / 1000;
process.stderr.write(`SFT run: ${sftSteps} steps in ${sftWallS.toFixed(0)} s; measuring\n`);

const models = new Map<string, Promise<JaxModel>>();
const deps: TrainStepDeps = {
  modelFor: (c) => {
    const key = JSON.stringify(c);
    if (!models.has(key)) models.set(key, createJaxModel(c));
    return models.get(key) as Promise<JaxModel>;
  },
  initConfig: null,
  loadReference: async (uri) => (await readCheckpoint(uri)).weights,
};
const refDir = mkdtempSync(join(tmpdir(), "rlq-opd-ref-"));
await writeCheckpoint(refDir, { config, weights: studentInit, version: 0, runId: "opd-student", step: -1 });

const teacherMeasures = measure(teacher, teacher);
const before = measure(studentInit, teacher);
const curve: Array<{ step: number } & Measures> = [{ step: 0, ...before }];
process.stderr.write(`teacher ${JSON.stringify(teacherMeasures)}\nstudent before ${JSON.stringify(before)}\n`);
let student = studentInit;
let uri: string | null = null;
const rng = new Prng(seed);
const opdT0 = Date.now();
for (let step = 0; step < opdSteps; step++) {
  const samples: TrainSample[] = [];
  for (let g = 0; g < 16; g++) {
    const row = trainRows[rng.nextInt(trainRows.length)] as { input: string };
    const prompt = tok.formatPrompt(row.input);
    for (let i = 0; i < 4; i++) {
      const response = generate(student, prompt, rng);
      const tokens = [...prompt, ...response];
      const at = (rows: Float64Array[]) => Float32Array.from(rows, (r, t) => r[response[t] as number] as number);
      samples.push({
        tokens: Int32Array.from(tokens),
        promptLength: prompt.length,
        responseLength: response.length,
        lossMask: new Uint8Array(response.length).fill(1),
        rolloutLogProbs: at(rowsOf(student, tokens, prompt.length)),
        teacherLogProbs: at(rowsOf(teacher, tokens, prompt.length)),
        tokenVersions: new Int32Array(response.length).fill(step),
        reward: 0,
        groupIndex: g,
        sampleIndex: i,
      });
    }
  }
  const req = await makeTrainRequest(student, refDir, {
    step,
    weightVersionIn: step,
    checkpointUriIn: uri,
    batch: { runId: "run-a", step, samples },
    config: { lr, num_steps_per_rollout: 1, use_tis: false, use_opd: true, opd_kl_coef: coef },
  });
  const out = await runEmbeddedTrainStep(req, deps, () => undefined);
  uri = out.checkpointUri;
  student = (await readCheckpoint(uri)).weights;
  if ((step + 1) % 20 === 0 || step + 1 === opdSteps) {
    curve.push({ step: step + 1, ...measure(student, teacher) });
    process.stderr.write(`OPD step ${step + 1}: ${JSON.stringify(curve.at(-1))}\n`);
  }
}
const after = curve.at(-1) as Measures;
const round = (x: number) => Number(x.toPrecision(4));
await writeResult("opd-teacher-student", {
  what: "on-policy distillation (use_opd, zero reward) of a weaker student toward an SFT-trained teacher on the demo task; held-out (examples/demo/eval.jsonl) reverse KL and task reward",
  command: `npx tsx bench/opd-teacher-student.ts --sft-steps ${sftSteps} --student-step ${studentStep} --opd-steps ${opdSteps} --lr ${lr} --coef ${coef} --seed ${seed}`,
  model: MODEL,
  sft: {
    trainer: "workers/trainer-torch/server.py --device cpu --threads 1, loss_type sft_loss, 128 rows a step, lr 3e-3",
    steps: sftSteps,
    student_after_steps: studentStep,
    loss_first: round(loss[0] as number),
    loss_last: round(loss.at(-1) as number),
    wall_s: round(sftWallS),
  },
  opd: { trainer: "the embedded train step", steps: opdSteps, samples_per_step: 64, lr, opd_kl_coef: coef, wall_s: round((Date.now() - opdT0) / 1000) },
  teacher: teacherMeasures,
  student_before: before,
  student_after: after,
  reverse_kl_fell_by_factor: round(before.reverse_kl / after.reverse_kl),
  expected_solve_rate_gain: round(after.expected_solve_rate - before.expected_solve_rate),
  greedy_solve_rate_gain: round(after.greedy_solve_rate - before.greedy_solve_rate),
  curve,
});
