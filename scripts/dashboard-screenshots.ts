/**
 * @file Screenshots of each dashboard view for docs/observability.md (docs/img/dashboard-*.png).
 *
 *   npx tsx scripts/dashboard-screenshots.ts                      # runs a short demo first (about a minute)
 *   npx tsx scripts/dashboard-screenshots.ts --url URL --run ID   # an `rlq dashboard` already serving a run
 *
 * Without --url it runs examples/demo.yaml for 6 steps (slime's nonzero-std filter on, so some
 * groups are filtered) in a throwaway database, starts `rlq dashboard` on it, and drives Debian's
 * chromium through playwright-core (test/helpers/chromium.ts). Each view is opened by its link
 * (the viewer keeps its state in the URL hash), so a screenshot shows what that link shows.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { chromium, type Page } from "playwright-core";
import { chromiumArgs, ensureChromium } from "../test/helpers/chromium.ts";
import { repoRoot, spawnRlq, waitFor, type Proc } from "../test/helpers/processes.ts";
import { createDemoWorld, type DemoWorld } from "../test/helpers/demo-runs.ts";
import globalSetup from "../test/helpers/global-setup.ts";

const { values } = parseArgs({ options: { url: { type: "string" }, run: { type: "string" }, out: { type: "string" } } });
const outDir = values.out ?? join(repoRoot, "docs/img");

/** A demo run driven to completion and a dashboard on it; `close` drops them. */
async function demoDashboard(): Promise<{ url: string; runId: string; close(): Promise<void> }> {
  await globalSetup();
  const world: DemoWorld = await createDemoWorld("shots");
  const procs: Proc[] = [];
  try {
    const runId = await world.start(
      [
        "num_rollout=6",
        "rollout_batch_size=8",
        "n_samples_per_prompt=4",
        "over_sampling_batch_size=12",
        "dynamic_sampling_filter_path=check_reward_nonzero_std",
      ],
      "screenshots",
    );
    await world.driveAll();
    const dash = spawnRlq(["dashboard", "--port", "0"], world.env);
    procs.push(dash);
    const url = await waitFor("the dashboard's address", async () => /dashboard listening (http:\/\/\S+)/.exec(dash.output())?.[1] ?? null, 60_000, 100);
    return {
      url,
      runId,
      async close() {
        for (const p of procs) p.kill("SIGTERM");
        await Promise.all(procs.map((p) => p.exited));
        await world.close();
      },
    };
  } catch (e) {
    for (const p of procs) p.kill("SIGKILL");
    await world.close();
    throw e;
  }
}

/** Opens `hash` and waits until the viewer (or the run page) has drawn it. */
async function open(page: Page, base: string, hash: string, ready: string): Promise<void> {
  await page.goto(`${base}/#${hash}`);
  // Browser-side expressions as strings: this file is compiled without the DOM's types.
  await page.waitForFunction("document.querySelector('#viewer')?.dataset.hash === location.hash");
  const error = await page.evaluate<string | undefined>("document.querySelector('#viewer')?.dataset.error");
  if (error) throw new Error(`the dashboard failed to show #${hash}: ${error}`);
  await page.waitForSelector(ready);
  await page.evaluate("window.scrollTo(0, 0)");
}

async function main(): Promise<void> {
  const browserCheck = await ensureChromium();
  if (!browserCheck.path) throw new Error(`dashboard screenshots need chromium: ${browserCheck.reason}`);
  const target = values.url && values.run ? { url: values.url, runId: values.run, close: async () => undefined } : await demoDashboard();
  const browser = await chromium.launch({ executablePath: browserCheck.path, headless: true, args: chromiumArgs });
  try {
    mkdirSync(outDir, { recursive: true });
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const run = `run=${encodeURIComponent(target.runId)}`;
    const shot = (name: string) => page.screenshot({ path: join(outDir, `dashboard-${name}.png`), fullPage: false });

    await open(page, target.url, run, "#chart-reward canvas");
    await page.waitForSelector("#v-steps tbody tr");
    await shot("run");
    await page.locator("#v-steps-panel").scrollIntoViewIfNeeded();
    await page.locator("#v-steps-panel").screenshot({ path: join(outDir, "dashboard-steps.png") });
    await page.locator("#decisions").scrollIntoViewIfNeeded();
    await page.locator("#decisions tbody tr .json-toggle").first().click();
    await page.locator("#decisions").screenshot({ path: join(outDir, "dashboard-decisions.png") });

    const steps = await page.locator("#v-steps tbody tr").evaluateAll((rows) => rows.map((r) => Number(r.getAttribute("data-step"))));
    const step = steps.find((s) => s > 0) ?? steps[0] ?? 0;
    await open(page, target.url, `${run}&view=step&step=${step}`, "#v-groups tbody tr");
    await shot("step");
    const group = await page.locator("#v-groups tbody tr").first().getAttribute("data-group");
    await open(page, target.url, `${run}&view=group&step=${step}&group=${group}`, "#v-samples tbody tr");
    await shot("group");
    const sample = await page.locator("#v-samples tbody tr").first().getAttribute("data-sample");
    for (const colour of ["version", "logprob", "mask"]) {
      await open(page, target.url, `${run}&view=sample&sample=${sample}&colour=${colour}`, `#v-tokens[data-colour="${colour}"] span`);
      await shot(`sample-${colour}`);
    }
    await open(page, target.url, `${run}&view=step&step=${step}&rmin=0.5&sql=1`, "#v-sql[open] pre.sql");
    await page.locator("#v-sql").scrollIntoViewIfNeeded();
    await shot("filter-sql");
    await open(page, target.url, `${run}&view=compare&a=${Math.max(0, step - 1)}&b=${step}`, "#v-compare tbody tr");
    await shot("compare");
    process.stdout.write(`screenshots of run ${target.runId} in ${outDir}\n`);
  } finally {
    await browser.close();
    await target.close();
  }
}

await main();
