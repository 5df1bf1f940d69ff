import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type Browser, type Page } from "playwright-core";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";
import { repoRoot, spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { chromiumArgs, ensureChromium } from "../helpers/chromium.ts";
import { upsertEngineMetrics } from "../../src/store/engine-metrics.ts";
import type { EngineMetricsSnapshot } from "../../src/engines/metrics.ts";

/**
 * The dashboard in a real browser: a demo run driven by `rlq up --dashboard`,
 * a second `rlq dashboard` process beside it, headless Chromium on both. The
 * charts must plot what SQL says, a sample opens with its tokens coloured by
 * version, Bull Board and /metrics answer, and after `rlq up` is SIGKILLed the
 * other dashboard still serves the run (and the restarted `rlq up` finishes it,
 * which the page then shows). Screenshots go to test-artifacts/dashboard/.
 */
const browserCheck = await ensureChromium();
if (browserCheck.reason) console.warn(`dashboard browser test skipped: ${browserCheck.reason}`);
const artifacts = join(repoRoot, "test-artifacts", "dashboard");
const token = "dashboard-test-token-0123456789";

async function listening(p: Proc, what: RegExp): Promise<string> {
  return waitFor(`${what} in output`, async () => what.exec(p.output())?.[1] ?? null, 120_000, 100);
}

async function committedSteps(world: DemoWorld, runId: string): Promise<Array<{ step: number; reward: number }>> {
  const r = await world.db.pool.query<{ step: number; reward: number }>(
    "SELECT t.step, (SELECT avg(h.reward)::float8 FROM rollout_history h WHERE h.run_id = t.run_id AND h.trained_step = t.step) AS reward FROM train_steps t WHERE t.run_id = $1 ORDER BY t.step",
    [runId],
  );
  return r.rows.map((x) => ({ step: Number(x.step), reward: Number(x.reward) }));
}

/** What the page plotted: x values and the "trained samples" reward series of the reward chart. */
async function plotted(page: Page, chart: string): Promise<{ xs: number[]; ys: Array<number | null> }> {
  return page.evaluate((id) => {
    const c = (globalThis as unknown as { rlqCharts: Map<string, { plot: { data: Array<Array<number | null>> } }> }).rlqCharts.get(id);
    if (!c) return { xs: [], ys: [] };
    return { xs: c.plot.data[0] as number[], ys: c.plot.data[1] as Array<number | null> };
  }, chart);
}

describe.skipIf(browserCheck.path === null)("dashboard in headless Chromium", () => {
  let world: DemoWorld;
  let browser: Browser;
  const procs: Proc[] = [];

  beforeAll(async () => {
    mkdirSync(artifacts, { recursive: true });
    world = await createDemoWorld("dash");
    browser = await chromium.launch({ executablePath: browserCheck.path as string, headless: true, args: chromiumArgs });
  });

  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    await browser?.close();
    await world?.close();
  });

  it("charts the run from SQL, opens a sample, serves Bull Board and /metrics, and survives a SIGKILL of rlq up", { timeout: 400_000 }, async () => {
    const runId = await world.start(
      [
        "num_rollout=12",
        "rollout_batch_size=8",
        "n_samples_per_prompt=4",
        "eval_interval=6",
        `eval_prompt_data.demo=${join(repoRoot, "examples/demo/eval.jsonl")}`,
        "n_samples_per_eval_prompt=2",
        "eval_pass_k=[1,2]",
      ],
      "dash-demo",
    );
    const env = { ...world.env, RLQ_DASHBOARD_TOKEN: token, RLQ_METRICS_PORT: "0" };
    const up = spawnRlq(["up", "--dashboard", "--dashboard-port", "0"], env);
    procs.push(up);
    const upUrl = await listening(up, /dashboard listening (http:\/\/\S+)/);
    const metricsPort = await listening(up, /metrics listening (\d+)/);
    const side = spawnRlq(["dashboard", "--port", "0"], { ...world.env });
    procs.push(side);
    const sideUrl = await listening(side, /dashboard listening (http:\/\/\S+)/);

    await waitFor("two committed train steps", async () => (await committedSteps(world, runId)).length >= 2, 200_000, 250);

    // The demo's embedded engine keeps no pool; a remote pool's telemetry row (what rollout
    // workers write every 5 s, src/jobs/workers.ts) is written here through the same store call.
    const engine: EngineMetricsSnapshot = {
      engineId: "sglang-0",
      state: "healthy",
      weightVersion: 1,
      requests: 120,
      inFlight: 3,
      completed: 110,
      aborted: 5,
      errors: 2,
      requestErrors: 0,
      busyChecks: 0,
      versionMismatches: 0,
      tokensGenerated: 900,
      tokensPerSecond: 42.5,
      latencyMs: { p50: 10, p95: 31, p99: 40 },
      deaths: 1,
      lastError: null,
    };
    await upsertEngineMetrics(world.db, runId, "host-a:123", { currentVersion: 1, isAdmissionPaused: false, queued: 0, engines: [engine] });

    const page = await browser.newPage({ viewport: { width: 1400, height: 1800 } });
    const pageErrors: string[] = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));
    await page.goto(`${upUrl}/#run=${runId}`);
    await page.waitForSelector("#chart-reward canvas");
    // The reward chart plots exactly the committed steps and their mean trained reward.
    await waitFor(
      "the reward chart to match SQL",
      async () => {
        const [facts, shown] = [await committedSteps(world, runId), await plotted(page, "reward")];
        return (
          shown.xs.length >= 2 &&
          shown.xs.length === facts.length &&
          shown.xs.every((x, i) => x === facts[i]?.step) &&
          shown.ys.every((y, i) => y !== null && Math.abs(y - (facts[i]?.reward ?? NaN)) < 1e-9)
        );
      },
      60_000,
      500,
    );
    for (const id of ["response_length", "pg_loss", "logprob_diff", "throughput"]) {
      const shown = await plotted(page, id);
      expect(shown.xs.length, id).toBeGreaterThanOrEqual(2);
      expect(
        shown.ys.some((y) => y !== null && Number.isFinite(y)),
        `${id} has values`,
      ).toBe(true);
    }
    expect(await page.locator("#decisions tbody tr").count()).toBeGreaterThan(0);
    expect(await page.locator("#engines tbody tr").first().locator("td").allTextContents()).toEqual([
      "host-a:123",
      "sglang-0",
      "healthy",
      "1",
      "3",
      "120",
      "2",
      "42.5",
      "31",
    ]);
    expect(await page.locator("#staleness tbody tr").count()).toBeGreaterThan(0);
    await page.screenshot({ path: join(artifacts, "run.png"), fullPage: true });

    // Click into a sample: its tokens, coloured by version, with the loss mask, as rollout_history has them.
    await page.waitForSelector("#samples tbody tr");
    await page.locator("#samples tbody tr").first().click();
    await page.waitForSelector("#sample-detail[data-loaded]");
    const loaded = (await page.locator("#sample-detail").getAttribute("data-loaded")) as string;
    const [groupId, sampleIndex] = loaded.split("/").map(Number);
    const { rows } = await world.db.pool.query<{ response_length: number; token_versions: number[]; loss_mask: number[] }>(
      "SELECT response_length, token_versions, loss_mask FROM rollout_history WHERE run_id = $1 AND group_id = $2 AND sample_index = $3",
      [runId, groupId, sampleIndex],
    );
    const fact = rows[0] as { response_length: number; token_versions: number[]; loss_mask: number[] };
    const spans = page.locator("#sample-tokens span");
    expect(await spans.count()).toBe(fact.response_length);
    expect(await spans.evaluateAll((els) => els.map((e) => Number(e.getAttribute("data-version"))))).toEqual(fact.token_versions);
    expect(await spans.evaluateAll((els) => els.map((e) => Number(e.getAttribute("data-mask"))))).toEqual(fact.loss_mask);
    await page.locator("#sample-detail").screenshot({ path: join(artifacts, "sample.png") });

    // The run list, and pause/resume guarded by the token.
    const bad = await fetch(`${upUrl}/api/runs/${runId}/resume`, { method: "POST", headers: { authorization: "Bearer wrong-token-wrong-token" } });
    expect(bad.status).toBe(401);
    const good = await fetch(`${upUrl}/api/runs/${runId}/resume`, { method: "POST", headers: { authorization: `Bearer ${token}` } });
    expect(good.status).toBe(200);
    const reqId = ((await good.json()) as { request: number }).request;
    const stored = await world.db.pool.query("SELECT kind FROM run_requests WHERE id = $1 AND run_id = $2", [reqId, runId]);
    expect(stored.rows[0]).toMatchObject({ kind: "resume" });
    const sideControl = await fetch(`${sideUrl}/api/runs/${runId}/pause`, { method: "POST", headers: { authorization: `Bearer ${token}` } });
    expect(sideControl.status).toBe(403); // that dashboard was started without a token: read-only
    await page.goto(`${upUrl}/`);
    await page.waitForSelector(`#runs tr[data-run="${runId}"] button[data-action="pause"]`);
    await page.screenshot({ path: join(artifacts, "runs.png") });

    // Bull Board on Redis.
    const boardQueues = (await (await fetch(`${upUrl}/queues/api/queues`)).json()) as { queues: Array<{ name: string }> };
    expect(boardQueues.queues.map((q) => q.name).sort()).toEqual(["rlq-eval", "rlq-reward", "rlq-rollout", "rlq-train"]);
    await page.goto(`${upUrl}/queues`);
    await page.getByText("rlq-rollout").first().waitFor();
    await page.screenshot({ path: join(artifacts, "bull-board.png") });

    // /metrics of the rlq up process.
    const scraped = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    expect(scraped).toMatch(/^rlq_queue_jobs\{queue="rollout",state="waiting"\} \d+$/m);
    expect(scraped).toMatch(new RegExp(`^rlq_lease_epoch\\{run="${runId}"\\} 1$`, "m"));
    expect(scraped).toMatch(new RegExp(`^rlq_engine\\{run="${runId}",worker="host-a:123",engine="sglang-0",field="errors"\\} 2$`, "m"));
    const completed = /^rlq_jobs_completed_total\{queue="rollout"\} (\d+)$/m.exec(scraped);
    expect(Number(completed?.[1])).toBeGreaterThan(0);

    // SIGKILL rlq up: the other dashboard still serves the run, from Postgres alone.
    up.kill("SIGKILL");
    await up.exited;
    const before = await committedSteps(world, runId);
    const sidePage = await browser.newPage({ viewport: { width: 1400, height: 1400 } });
    await sidePage.goto(`${sideUrl}/#run=${runId}`);
    await sidePage.waitForSelector("#chart-reward canvas");
    await waitFor("the side dashboard to chart the run", async () => (await plotted(sidePage, "reward")).xs.length === before.length, 30_000, 250);
    await sidePage.screenshot({ path: join(artifacts, "after-sigkill.png"), fullPage: true });

    // A restarted rlq up finishes the run; the side dashboard follows it to the end.
    const again = spawnRlq(["up", "--run", runId, "--exit-when-done"], world.env);
    procs.push(again);
    expect(await again.exited, again.output()).toBe(0);
    await waitFor("the side dashboard to show all twelve steps", async () => (await plotted(sidePage, "reward")).xs.length === 12, 30_000, 250);
    // The run completes after its final eval; the page follows on its next refresh.
    await waitFor(
      "the side dashboard to show the run completed",
      async () => ((await sidePage.locator("#run-status").textContent()) ?? "").includes("status completed"),
      30_000,
      250,
    );
    // Eval pass@k: one point per eval (steps 0, 6 and the end), the values eval_results holds.
    const evals = (
      await world.db.pool.query<{ step: number; k1: number }>(
        "SELECT step, (pass_at_k->>'1')::float8 AS k1 FROM eval_results WHERE run_id = $1 ORDER BY step",
        [runId],
      )
    ).rows;
    await waitFor("the pass@k chart", async () => (await plotted(sidePage, "pass_at_k")).xs.length === evals.length, 30_000, 250);
    const passAt = await plotted(sidePage, "pass_at_k");
    expect(passAt.xs).toEqual(evals.map((e) => Number(e.step)));
    expect(passAt.ys).toEqual(evals.map((e) => Number(e.k1)));
    await sidePage.screenshot({ path: join(artifacts, "completed.png"), fullPage: true });
    expect(pageErrors).toEqual([]);
  });
});
