import { fileURLToPath } from "node:url";
import { readEnv } from "../config/env.ts";
import { createServices } from "../runtime/services.ts";
import { startRun } from "../api.ts";
import { runUp } from "./up.ts";
import { createProgressDisplay } from "../observability/progress.ts";

/**
 * `npm run demo`: start the demo run (examples/demo.yaml, or `options.configPath`) and drive it in
 * this process — controller and all workers — printing the reward as it rises. Ctrl-C stops it;
 * `rlq up --run ID` resumes it exactly. scripts/demo-vllm.ts runs it with examples/vllm-demo.yaml.
 */
export async function runDemo(sets: readonly string[], options: { configPath?: string; name?: string } = {}): Promise<number> {
  const env = readEnv();
  const configPath = options.configPath ?? fileURLToPath(new URL("../../examples/demo.yaml", import.meta.url));
  process.stderr.write(
    `rlq demo: Postgres ${env.DATABASE_URL ? "from DATABASE_URL" : `embedded under ${env.RLQ_HOME}/pg`}, queues on ${env.REDIS_URL ? "Redis" : "BullMQ's Postgres backend"}\n`,
  );
  const s = await createServices({ ...env, RLQ_LOG_LEVEL: env.RLQ_LOG_LEVEL === "info" ? "warn" : env.RLQ_LOG_LEVEL }, { applicationName: "rlq-demo" });
  const ac = new AbortController();
  const stop = () => ac.abort();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  try {
    const { runId, config } = await startRun(s.db, { config: configPath, set: sets, name: options.name ?? "demo" });
    process.stdout.write(`run ${runId}: ${config.num_rollout} steps of ${config.rollout_batch_size} prompts x ${config.n_samples_per_prompt} samples\n`);
    process.stdout.write("step  reward(mean of its samples)  logprob|train-rollout|  seconds\n");
    const t0 = Date.now();
    let shown = 0;
    const rewards: number[] = [];
    // Steps with an ETA on stderr: redrawn in place on a TTY, plain lines otherwise.
    const progress = createProgressDisplay({ stream: process.stderr, isTty: process.stderr.isTTY === true, columns: process.stderr.columns });
    const show = async () => {
      const { rows } = await s.db.pool.query(
        `SELECT t.step, avg(h.reward) AS reward, max(m.value) FILTER (WHERE m.key = 'train_rollout_logprob_abs_diff') AS diff
         FROM train_steps t JOIN rollout_history h ON h.run_id = t.run_id AND h.trained_step = t.step
         LEFT JOIN train_metrics m ON m.run_id = t.run_id AND m.step = t.step
         WHERE t.run_id = $1 AND t.step >= $2 GROUP BY t.step ORDER BY t.step`,
        [runId, shown],
      );
      for (const r of rows as Array<{ step: number; reward: number; diff: number | null }>) {
        if (r.step !== shown) break;
        rewards.push(Number(r.reward));
        progress.clear();
        process.stdout.write(
          `${String(r.step).padStart(4)}  ${Number(r.reward).toFixed(3).padStart(27)}  ${(r.diff === null ? "-" : Number(r.diff).toExponential(1)).padStart(20)}  ${((Date.now() - t0) / 1000).toFixed(1).padStart(7)}\n`,
        );
        shown++;
        progress.redraw();
      }
    };
    // A missed redraw (the database busy or briefly away) is drawn by the next tick, and the
    // show() after the run prints every step left: nothing is lost.
    const timer = setInterval(() => void show().catch(() => undefined), 500);
    try {
      await runUp(s, { runId, exitWhenDone: true, signal: ac.signal, progress });
    } finally {
      clearInterval(timer);
    }
    await show();
    if (rewards.length >= 6) {
      const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
      process.stdout.write(
        `\nreward: first 3 steps ${mean(rewards.slice(0, 3)).toFixed(3)} -> last 3 steps ${mean(rewards.slice(-3)).toFixed(3)} in ${((Date.now() - t0) / 1000).toFixed(0)} s\n`,
      );
    }
    process.stdout.write(
      `\nAsk the run anything in SQL, e.g.\n  npx rlq sql "SELECT * FROM reward_by_version WHERE run_id = '${runId}' ORDER BY weight_version"\n`,
    );
    return 0;
  } finally {
    await s.close();
  }
}
