/**
 * rlq beside TRL on the same work (bench/README.md, "Peers: TRL"): the fixture model
 * (scripts/build-fixture-model.py), the demo task (examples/demo/train.jsonl, reward rm_type math),
 * 16 prompts × 8 samples a step, one optimizer step per batch, lr 1e-4, clip 1.0, no KL term,
 * temperature 1, responses up to 12 tokens.
 *
 * - trl: TRL's GRPOTrainer with its own generation (bench/peers/trl_grpo.py in .venv-peers,
 *   built by bench/peers/setup.sh);
 * - rlq_sync / rlq_async: rlq in this process (runUntilDone: controller and workers) on a real
 *   vLLM CPU server with the PyTorch trainer on two FSDP2 ranks, weight_sync disk; async is
 *   train_async with max_staleness 1 and TIS.
 *
 * Arms are interleaved within each repetition, their order rotated per repetition. For each run:
 * the time from the first step's start to the step where the reward (the mean over a step's
 * samples, averaged over the last 3 steps) first reaches --target; samples/s over the whole run;
 * CPU seconds per sample of every process of the arm (rlq: this process, vLLM's process group and
 * the trainer's; TRL: its process and children). Start-up (model load, vLLM and trainer boot) is
 * reported apart and left out of both sides' times.
 *
 *   npx tsx bench/peers-trl.ts [--reps 3] [--steps 30] [--target 0.65] [--arms trl,rlq_sync,rlq_async]
 */
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { runUntilDone } from "../src/run-until-done.ts";
import { createDb } from "../src/store/db.ts";
import { createTestDatabase, redisUrl } from "../test/helpers/services.ts";
import { fixtureModel, repoRoot, startTorchTrainer, startVllm, venvPython, type Server } from "../scripts/real-stack.ts";
import { median, prepareServices, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    reps: { type: "string", default: "3" },
    steps: { type: "string", default: "30" },
    target: { type: "string", default: "0.65" },
    arms: { type: "string", default: "trl,rlq_sync,rlq_async" },
    out: { type: "string", default: "peers-trl" },
  },
});
const reps = Number(values.reps);
const steps = Number(values.steps);
const target = Number(values.target);
const arms = values.arms.split(",") as Arm[];
type Arm = "trl" | "rlq_sync" | "rlq_async";

/** The settings both sides run with (bench/README.md names what each side may tune). */
const shared = { prompts_per_step: 16, group: 8, lr: 1e-4, max_response_len: 12, clip_grad: 1.0, temperature: 1.0 };

interface StepPoint {
  step: number;
  reward: number;
  /** Seconds since the run's first step started. */
  t: number;
}
interface RunResult {
  arm: Arm;
  rep: number;
  startup_s: number;
  wall_s: number;
  samples: number;
  samples_per_s: number;
  cpu_s: number;
  cpu_s_per_sample: number;
  time_to_target_s: number | null;
  /** Samples/s from the end of the first step to the end of the last: the run past its warm-up. */
  steady_samples_per_s: number;
  steps: StepPoint[];
}

function steadyRate(points: StepPoint[], samplesPerStep: number): number {
  const first = points[0] as StepPoint;
  const last = points[points.length - 1] as StepPoint;
  return ((points.length - 1) * samplesPerStep) / (last.t - first.t);
}

/** The first time at which the mean reward of the last 3 steps reaches the target. */
function timeToTarget(points: StepPoint[]): number | null {
  for (let i = 2; i < points.length; i++) {
    const w = points.slice(i - 2, i + 1);
    if (w.reduce((a, p) => a + p.reward, 0) / 3 >= target) return (points[i] as StepPoint).t;
  }
  return null;
}

const TICK = 100; // USER_HZ
/** CPU seconds of every live process in a process group, with what its reaped children used. */
function groupCpuSeconds(pgid: number): number {
  let total = 0;
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const f = readFileSync(`/proc/${name}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
      if (Number(f[2]) !== pgid) continue;
      total += (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / TICK;
    } catch {
      // exited between the listing and the read
    }
  }
  return total;
}

async function runTrl(rep: number, peersPython: string, model: string): Promise<RunResult> {
  const dir = mkdtempSync(join(tmpdir(), "rlq-trl-"));
  const out = join(dir, "trl.json");
  const args = [join(repoRoot, "bench/peers/trl_grpo.py"), "--model", model, "--data", join(repoRoot, "examples/demo/train.jsonl")];
  args.push("--steps", String(steps), "--prompts-per-step", String(shared.prompts_per_step), "--group", String(shared.group));
  args.push("--lr", String(shared.lr), "--max-response-len", String(shared.max_response_len), "--seed", String(1234 + rep), "--out", out);
  const child = spawn(peersPython, args, { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, HF_HUB_OFFLINE: "1" } });
  let log = "";
  child.stdout.on("data", (d: Buffer) => (log = (log + d.toString()).slice(-20_000)));
  child.stderr.on("data", (d: Buffer) => (log = (log + d.toString()).slice(-20_000)));
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  if (code !== 0) throw new Error(`trl_grpo.py failed (exit ${code}):\n${log.slice(-6000)}`);
  const r = JSON.parse(readFileSync(out, "utf8")) as { load_s: number; train_wall_s: number; cpu_s: number; samples: number; steps: StepPoint[] };
  rmSync(dir, { recursive: true, force: true });
  return {
    arm: "trl",
    rep,
    startup_s: r.load_s,
    wall_s: r.train_wall_s,
    samples: r.samples,
    samples_per_s: r.samples / r.train_wall_s,
    cpu_s: r.cpu_s,
    cpu_s_per_sample: r.cpu_s / r.samples,
    time_to_target_s: timeToTarget(r.steps),
    steady_samples_per_s: steadyRate(r.steps, shared.prompts_per_step * shared.group),
    steps: r.steps.map((s) => ({ step: s.step, reward: s.reward, t: s.t })),
  };
}

async function runRlq(arm: "rlq_sync" | "rlq_async", rep: number, python: string, model: string): Promise<RunResult> {
  const bootAt = performance.now();
  const servers: Server[] = [];
  const database = await createTestDatabase(`rlq_peers_${arm}`);
  const home = mkdtempSync(join(tmpdir(), "rlq-peers-"));
  try {
    const [vllm, trainer] = await Promise.all([
      startVllm({ python, model, servedModelName: "fixture" }).then((s) => (servers.push(s), s)),
      startTorchTrainer(python, ["--threads", "1", "--nproc", "2", "--sharding", "fsdp"]).then((s) => (servers.push(s), s)),
    ]);
    const startup = (performance.now() - bootAt) / 1000;
    const config = {
      prompt_data: join(repoRoot, "examples/demo/train.jsonl"),
      apply_chat_template: true,
      rm_type: "math",
      hf_checkpoint: model,
      ref_load: model,
      rollout_batch_size: shared.prompts_per_step,
      n_samples_per_prompt: shared.group,
      num_rollout: steps,
      rollout_max_response_len: shared.max_response_len,
      rollout_temperature: shared.temperature,
      rollout_shuffle: true,
      advantage_estimator: "grpo",
      lr: shared.lr,
      clip_grad: shared.clip_grad,
      seed: 1234 + rep,
      rollout_seed: 42 + rep,
      engine: { kind: "openai", urls: [vllm.url], model: "fixture" },
      weight_sync: "disk",
      trainer: { kind: "remote", url: trainer.url },
      ...(arm === "rlq_async" ? { train_async: true, max_staleness: 1, use_tis: true } : {}),
    };
    const env = {
      ...process.env,
      DATABASE_URL: database.url,
      REDIS_URL: redisUrl,
      RLQ_QUEUE_PREFIX: `peers${Date.now().toString(36)}`,
      RLQ_HOME: home,
      RLQ_LOG_LEVEL: "warn",
    };
    const cpu0 = process.cpuUsage();
    const groups = servers.map((s) => s.child.pid as number);
    const groupCpu0 = groups.map(groupCpuSeconds);
    const t0 = performance.now();
    const startedAt = Date.now();
    const done = await runUntilDone(config, { env, name: `peers-${arm}-${rep}` });
    const wall = (performance.now() - t0) / 1000;
    const groupCpu = groups.map(groupCpuSeconds).reduce((a, c, i) => a + c - (groupCpu0[i] as number), 0);
    const own = process.cpuUsage(cpu0);
    const cpu = groupCpu + (own.user + own.system) / 1e6;
    if (done.outcome !== "completed") throw new Error(`${arm}: the run ended ${done.outcome}`);
    const db = createDb(database.url, { max: 1 });
    try {
      const rows = (await db.pool.query(
        `SELECT t.step, avg(h.reward)::float8 AS reward, count(*)::int AS n, extract(epoch FROM t.committed_at) * 1000 AS at
           FROM train_steps t JOIN rollout_history h ON h.run_id = t.run_id AND h.trained_step = t.step
          WHERE t.run_id = $1 GROUP BY t.step, t.committed_at ORDER BY t.step`,
        [done.runId],
      )) as { rows: Array<{ step: number; reward: number; n: number; at: string }> };
      const points = rows.rows.map((r) => ({ step: Number(r.step) + 1, reward: Number(r.reward), t: (Number(r.at) - startedAt) / 1000 }));
      const samples = rows.rows.reduce((a, r) => a + Number(r.n), 0);
      return {
        arm,
        rep,
        startup_s: startup,
        wall_s: wall,
        samples,
        samples_per_s: samples / wall,
        cpu_s: cpu,
        cpu_s_per_sample: cpu / samples,
        time_to_target_s: timeToTarget(points),
        steady_samples_per_s: steadyRate(points, shared.prompts_per_step * shared.group),
        steps: points,
      };
    } finally {
      await db.close();
    }
  } finally {
    await Promise.all(servers.map((s) => s.stop()));
    await database.drop();
    rmSync(home, { recursive: true, force: true });
  }
}

/** TRL's own environment (bench/peers/setup.sh), kept apart from rlq's so a peer's pins never move rlq's. */
async function peersPython(): Promise<string> {
  const r = spawn("bash", [join(repoRoot, "bench/peers/setup.sh")], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
  const code = await new Promise<number | null>((resolve) => r.once("exit", resolve));
  if (code !== 0) throw new Error("bench/peers/setup.sh failed: run it and read its output");
  return join(repoRoot, ".venv-peers/bin/python");
}

await prepareServices();
const python = venvPython();
const trlPython = await peersPython();
const model = await fixtureModel(python);
const results: RunResult[] = [];
for (let rep = 0; rep < reps; rep++) {
  const order = arms.map((_, i) => arms[(i + rep) % arms.length] as Arm);
  for (const arm of order) {
    process.stderr.write(`peers-trl: rep ${rep + 1}/${reps} ${arm}\n`);
    const r = arm === "trl" ? await runTrl(rep, trlPython, model) : await runRlq(arm, rep, python, model);
    process.stderr.write(
      `  ${arm}: ${r.samples_per_s.toFixed(1)} samples/s, ${r.cpu_s_per_sample.toFixed(3)} CPU s/sample, to target ${r.time_to_target_s?.toFixed(1) ?? "not reached"} s\n`,
    );
    results.push(r);
  }
}
const summary: Record<string, unknown> = {};
for (const arm of arms) {
  const rs = results.filter((r) => r.arm === arm);
  const reached = rs.map((r) => r.time_to_target_s).filter((t): t is number => t !== null);
  summary[arm] = {
    samples_per_s: median(rs.map((r) => r.samples_per_s)),
    steady_samples_per_s: median(rs.map((r) => r.steady_samples_per_s)),
    first_step_s: median(rs.map((r) => (r.steps[0] as StepPoint).t)),
    cpu_s_per_sample: median(rs.map((r) => r.cpu_s_per_sample)),
    time_to_target_s: reached.length === rs.length ? median(reached) : null,
    reached_target: `${reached.length}/${rs.length}`,
    startup_s: median(rs.map((r) => r.startup_s)),
    reward_first_3: median(rs.map((r) => r.steps.slice(0, 3).reduce((a, p) => a + p.reward, 0) / 3)),
    reward_last_3: median(rs.map((r) => r.steps.slice(-3).reduce((a, p) => a + p.reward, 0) / 3)),
  };
}
const ratio = (a: string, b: string, k: "samples_per_s" | "steady_samples_per_s" | "time_to_target_s") => {
  const x = (summary[a] as Record<string, number | null> | undefined)?.[k];
  const y = (summary[b] as Record<string, number | null> | undefined)?.[k];
  return typeof x === "number" && typeof y === "number" ? x / y : null;
};
await writeResult(values.out, {
  what: "rlq beside TRL's GRPOTrainer on the fixture model and the demo task, same settings (bench/README.md, Peers: TRL)",
  command: `npx tsx bench/peers-trl.ts --reps ${reps} --steps ${steps} --target ${target} --arms ${values.arms}`,
  shared,
  steps,
  target,
  reps,
  summary,
  ratios: {
    rlq_sync_samples_per_s_over_trl: ratio("rlq_sync", "trl", "samples_per_s"),
    rlq_async_samples_per_s_over_trl: ratio("rlq_async", "trl", "samples_per_s"),
    rlq_sync_steady_samples_per_s_over_trl: ratio("rlq_sync", "trl", "steady_samples_per_s"),
    rlq_async_steady_samples_per_s_over_trl: ratio("rlq_async", "trl", "steady_samples_per_s"),
    rlq_sync_time_to_target_over_trl: ratio("rlq_sync", "trl", "time_to_target_s"),
    rlq_async_time_to_target_over_trl: ratio("rlq_async", "trl", "time_to_target_s"),
  },
  load_average: readFileSync("/proc/loadavg", "utf8").trim(),
  runs: results,
});
process.exit(0);
