import { join } from "node:path";
import { mkdirSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type Browser, type Page } from "playwright-core";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";
import { repoRoot, runCommand, spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { chromiumArgs, ensureChromium } from "../helpers/chromium.ts";

/**
 * The rollout viewer in headless Chromium on a real demo run (examples/demo.yaml, slime's
 * nonzero-std filter on, so some groups are filtered and some discarded as surplus): from the
 * runs list to a step, a group and a sample, each table checked against rollout_history; the
 * token colouring switched; the samples filtered by reward; the SQL panel opened and its
 * `rlq sql` command run through bash as shown, giving the rows on the page; two steps compared.
 * Every view is reached by clicking and then reloaded from its URL alone. Screenshots go to
 * test-artifacts/viewer/.
 */
const browserCheck = await ensureChromium();
if (!browserCheck.path) throw new Error(`the viewer test needs chromium (apt-get install -y chromium): ${browserCheck.reason}`);
const artifacts = join(repoRoot, "test-artifacts", "viewer");

/**
 * Does `act` (a click, a selection) and waits until the viewer has drawn the hash it led to: one
 * more render than before, of the page's current hash. Fails with the viewer's error if it had one.
 */
async function drawnAfter(page: Page, act: () => Promise<unknown>): Promise<void> {
  // Browser-side expressions as strings: this file is compiled without the DOM's types.
  const before = await page.evaluate<number>("Number(document.querySelector('#viewer')?.dataset.renders ?? 0)");
  await act();
  await page.waitForFunction(
    `Number(document.querySelector('#viewer')?.dataset.renders ?? 0) > ${before} && document.querySelector('#viewer')?.dataset.hash === location.hash`,
  );
  const error = await page.evaluate<string | undefined>("document.querySelector('#viewer')?.dataset.error");
  expect(error ?? "", `viewer error at ${page.url()}`).toBe("");
}

const attrs = (page: Page, sel: string, name: string) => page.locator(sel).evaluateAll((els, n) => els.map((e) => e.getAttribute(n)), name);

describe("rollout viewer in headless Chromium", () => {
  let world: DemoWorld;
  let browser: Browser;
  let dashboard: Proc;
  let url: string;
  let runId: string;

  beforeAll(async () => {
    mkdirSync(artifacts, { recursive: true });
    world = await createDemoWorld("viewer");
    runId = await world.start(
      [
        "num_rollout=3",
        "rollout_batch_size=8",
        "n_samples_per_prompt=4",
        "over_sampling_batch_size=12",
        "dynamic_sampling_filter_path=check_reward_nonzero_std",
      ],
      "viewer-demo",
    );
    await world.driveAll();
    dashboard = spawnRlq(["dashboard", "--port", "0"], world.env);
    url = await waitFor("the dashboard's address", async () => /dashboard listening (http:\/\/\S+)/.exec(dashboard.output())?.[1] ?? null, 120_000, 100);
    browser = await chromium.launch({ executablePath: browserCheck.path, headless: true, args: chromiumArgs });
  }, 400_000);

  afterAll(async () => {
    dashboard?.kill("SIGKILL");
    await dashboard?.exited;
    await browser?.close();
    await world?.close();
  });

  it("clicks from the runs list to a step, a group and a sample, colours, filters, shows its SQL and compares two steps", { timeout: 300_000 }, async () => {
    const q = async <T = Record<string, unknown>>(text: string, params: unknown[] = []) => (await world.db.pool.query(text, params)).rows as T[];
    const page = await browser.newPage({ viewport: { width: 1300, height: 1000 } });
    const pageErrors: string[] = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));

    // Runs list → the run: its steps, newest first, with the groups each kept and filtered.
    await page.goto(`${url}/`);
    await drawnAfter(page, () => page.locator(`#runs tr[data-run="${runId}"]`).click());
    await page.waitForSelector("#v-steps tbody tr");
    const steps = await q<{ step: number; kept: number; filtered: number; discarded: number }>(
      `SELECT step, count(DISTINCT group_id) FILTER (WHERE outcome = 'kept')::int AS kept,
              count(DISTINCT group_id) FILTER (WHERE outcome = 'filtered')::int AS filtered,
              count(DISTINCT group_id) FILTER (WHERE outcome = 'discarded')::int AS discarded
         FROM rollout_history WHERE run_id = $1 GROUP BY step ORDER BY step DESC`,
      [runId],
    );
    expect((await attrs(page, "#v-steps tbody tr", "data-step")).map(Number)).toEqual(steps.map((s) => s.step));
    const stepCells = await page
      .locator("#v-steps tbody tr")
      .evaluateAll((rows) => rows.map((r) => [...r.querySelectorAll("td")].slice(2, 5).map((td) => Number(td.textContent))));
    expect(stepCells).toEqual(steps.map((s) => [s.kept, s.filtered, s.discarded]));
    await page.screenshot({ path: join(artifacts, "run.png"), fullPage: true });

    // A step (one with a filtered group when the demo made one): its groups, with the filter's reasons.
    const step = steps.find((s) => s.filtered > 0)?.step ?? (steps[0] as { step: number }).step;
    await drawnAfter(page, () => page.locator(`#v-steps tr[data-step="${step}"]`).click());
    expect(page.url()).toContain(`view=step&step=${step}`);
    const groups = await q<{ group_id: string; outcome: string; reason: string | null }>(
      "SELECT group_id, min(outcome) AS outcome, min(outcome_reason) AS reason FROM rollout_history WHERE run_id = $1 AND step = $2 GROUP BY group_id ORDER BY group_id",
      [runId, step],
    );
    expect(await attrs(page, "#v-groups tbody tr", "data-group")).toEqual(groups.map((g) => String(g.group_id)));
    expect(await attrs(page, "#v-groups tbody tr", "data-outcome")).toEqual(groups.map((g) => g.outcome));
    const reasons = await page.locator("#v-groups tbody tr td:nth-child(3)").allTextContents();
    expect(reasons).toEqual(groups.map((g) => g.reason ?? ""));
    await page.screenshot({ path: join(artifacts, "step.png"), fullPage: true });

    // A group: its samples only.
    const group = Number((groups[0] as { group_id: string }).group_id);
    await drawnAfter(page, () => page.locator(`#v-groups tr[data-group="${group}"]`).click());
    const groupSamples = await q<{ sample_index: number }>(
      "SELECT sample_index FROM rollout_history WHERE run_id = $1 AND group_id = $2 ORDER BY sample_index",
      [runId, group],
    );
    expect(await attrs(page, "#v-samples tbody tr", "data-sample")).toEqual(groupSamples.map((s) => `${group}/${s.sample_index}`));

    // A sample: every response token, coloured by the version that sampled it.
    await drawnAfter(page, () => page.locator(`#v-samples tr[data-sample="${group}/0"]`).click());
    await page.waitForSelector(`#v-title[data-loaded="${group}/0"]`);
    const [fact] = await q<{ response_length: number; token_versions: number[]; loss_mask: number[]; rollout_log_probs: number[]; reward: number }>(
      "SELECT response_length, token_versions, loss_mask, rollout_log_probs, reward FROM rollout_history WHERE run_id = $1 AND group_id = $2 AND sample_index = 0",
      [runId, group],
    );
    if (!fact) throw new Error(`no sample ${group}/0 in rollout_history`);
    const spans = page.locator("#v-tokens span");
    expect(await spans.count()).toBe(fact.response_length);
    expect((await attrs(page, "#v-tokens span", "data-version")).map(Number)).toEqual(fact.token_versions);
    expect(await page.locator("#v-tokens").getAttribute("data-colour")).toBe("version");
    expect(await page.locator("#v-segments tbody tr").count()).toBeGreaterThan(0);
    const backgrounds = () => spans.evaluateAll((els) => els.map((e) => e.getAttribute("style")));
    const byVersion = await backgrounds();

    // Switch the colouring: the loss mask (every demo token is trained: one colour), then the rollout log-prob.
    await drawnAfter(page, () => page.locator("#v-colour").selectOption("mask"));
    await page.waitForSelector('#v-tokens[data-colour="mask"]');
    expect(page.url()).toContain("colour=mask");
    const byMask = await backgrounds();
    expect(new Set(byMask).size).toBe(new Set(fact.loss_mask).size);
    expect((await attrs(page, "#v-tokens span", "data-mask")).map(Number)).toEqual(fact.loss_mask);
    await drawnAfter(page, () => page.locator("#v-colour").selectOption("logprob"));
    await page.waitForSelector('#v-tokens[data-colour="logprob"]');
    expect((await attrs(page, "#v-tokens span", "data-logprob")).map(Number)).toEqual(fact.rollout_log_probs);
    expect(await backgrounds()).not.toEqual(byVersion);
    await page.screenshot({ path: join(artifacts, "sample.png"), fullPage: true });

    // The link alone brings the same view back.
    await page.reload();
    await page.waitForFunction("document.querySelector('#viewer')?.dataset.hash === location.hash");
    expect(await page.locator("#v-tokens").getAttribute("data-colour")).toBe("logprob");

    // The teacher's colourings are offered only for a sample with teacher log-probs: the demo does not
    // distil, so not here. The sample's projection row is then given per-token teacher log-probs as an
    // OPD run's reward job stores them (here the rollout's less 0, 0.5 and 1 nats in turn), and the
    // viewer shows those values, colours each token by the sign of teacher − rollout, and titles both.
    const offered = () => page.locator("#v-colour option").evaluateAll((els) => els.map((e) => e.getAttribute("value")));
    expect(await offered()).not.toContain("teacher");
    await q(
      `UPDATE rollout_history SET teacher_log_probs =
         (SELECT array_agg(lp - 0.5 * ((o - 1) % 3) ORDER BY o) FROM unnest(rollout_log_probs) WITH ORDINALITY AS t(lp, o))
        WHERE run_id = $1 AND group_id = $2 AND sample_index = 0`,
      [runId, group],
    );
    const [taught] = await q<{ teacher_log_probs: number[] }>(
      "SELECT teacher_log_probs FROM rollout_history WHERE run_id = $1 AND group_id = $2 AND sample_index = 0",
      [runId, group],
    );
    await page.reload();
    await page.waitForFunction("document.querySelector('#viewer')?.dataset.hash === location.hash");
    expect(await offered()).toEqual(expect.arrayContaining(["teacher", "teacherdiff"]));
    await drawnAfter(page, () => page.locator("#v-colour").selectOption("teacherdiff"));
    await page.waitForSelector('#v-tokens[data-colour="teacherdiff"]');
    expect((await attrs(page, "#v-tokens span", "data-teacher-logprob")).map(Number)).toEqual(taught?.teacher_log_probs);
    const titles = await attrs(page, "#v-tokens span", "title");
    expect(titles.every((t) => /teacher log p .* · rollout log p .* · difference /.test(t ?? ""))).toBe(true);
    const rgb = await page.evaluate<number[][]>(
      "[...document.querySelectorAll('#v-tokens span')].map((e) => (getComputedStyle(e).backgroundColor.match(/\\d+/g) ?? []).slice(0, 3).map(Number))",
    );
    rgb.forEach(([r, g, b], i) => {
      // Equal log-probs are white; a teacher less sure than the rollout (negative difference) is blue.
      if (i % 3 === 0) expect([r, g, b], `token ${i}`).toEqual([255, 255, 255]);
      else expect(b! > r!, `token ${i}: rgb(${r}, ${g}, ${b}) is not blue`).toBe(true);
    });
    await drawnAfter(page, () => page.locator("#v-colour").selectOption("teacher"));
    await page.waitForSelector('#v-tokens[data-colour="teacher"]');
    expect(titles).not.toEqual(await attrs(page, "#v-tokens span", "title"));

    // Train log-probs: the winning attempt of each step stored one row per trained sample (no more),
    // each as long as the response, and they are the ones the trainer's own mismatch metric read: per
    // step, the masked mean |train − rollout| from SQL is its train_rollout_logprob_abs_diff.
    const [counts] = await q<{ stored: string; trained: string }>(
      `SELECT (SELECT count(*) FROM train_log_probs WHERE run_id = $1) AS stored,
              (SELECT count(*) FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL) AS trained`,
      [runId],
    );
    expect(Number(counts?.stored)).toBeGreaterThan(0);
    expect(counts?.stored).toBe(counts?.trained);
    const mismatch = await q<{ step: number; from_sql: number; metric: number; bad_lengths: string }>(
      `SELECT tl.step, avg(abs(u.lp - u.rlp)) FILTER (WHERE u.m = 1) AS from_sql,
              (SELECT value FROM train_metrics m WHERE m.run_id = tl.run_id AND m.step = tl.step AND key = 'train_rollout_logprob_abs_diff') AS metric,
              count(*) FILTER (WHERE u.lp IS NULL OR u.rlp IS NULL) AS bad_lengths
         FROM train_log_probs tl
         JOIN rollout_history h ON h.run_id = tl.run_id AND h.group_id = tl.group_id AND h.sample_index = tl.sample_index AND h.trained_step = tl.step,
              unnest(tl.log_probs, h.rollout_log_probs, h.loss_mask) AS u(lp, rlp, m)
        WHERE tl.run_id = $1 GROUP BY tl.run_id, tl.step ORDER BY tl.step`,
      [runId],
    );
    expect(mismatch.length).toBeGreaterThan(0);
    for (const m of mismatch) {
      expect(Number(m.bad_lengths), `step ${m.step}: train and rollout log-probs differ in length`).toBe(0);
      expect(Number(m.from_sql), `step ${m.step}`).toBeCloseTo(Number(m.metric), 5);
    }

    // The train − rollout colouring on a trained sample: the stored values, both and their difference
    // in each title, blue where the trainer gives less than the engine did, red where more.
    const [trainedSample] = await q<{ group_id: string; sample_index: number; log_probs: number[]; rollout_log_probs: number[] }>(
      `SELECT tl.group_id, tl.sample_index, tl.log_probs, h.rollout_log_probs
         FROM train_log_probs tl JOIN rollout_history h USING (run_id, group_id, sample_index)
        WHERE tl.run_id = $1 ORDER BY tl.group_id, tl.sample_index LIMIT 1`,
      [runId],
    );
    if (!trainedSample) throw new Error("no trained sample in train_log_probs");
    const sampleHash = await page.evaluate<string>("location.hash");
    const ref = `${trainedSample.group_id}/${trainedSample.sample_index}`;
    await drawnAfter(page, () => page.evaluate(`location.hash = ${JSON.stringify(`#run=${runId}&view=sample&sample=${ref}&colour=traindiff`)}`));
    await page.waitForSelector(`#v-title[data-loaded="${ref}"]`);
    expect(await page.locator("#v-tokens").getAttribute("data-colour")).toBe("traindiff");
    expect((await attrs(page, "#v-tokens span", "data-train-logprob")).map(Number)).toEqual(trainedSample.log_probs);
    const trainTitles = await attrs(page, "#v-tokens span", "title");
    expect(trainTitles.every((t) => /train log p .* · rollout log p .* · difference /.test(t ?? ""))).toBe(true);
    const trainRgb = await page.evaluate<number[][]>(
      "[...document.querySelectorAll('#v-tokens span')].map((e) => (getComputedStyle(e).backgroundColor.match(/\\d+/g) ?? []).slice(0, 3).map(Number))",
    );
    trainRgb.forEach(([r, g, b], i) => {
      const d = (trainedSample.log_probs[i] as number) - (trainedSample.rollout_log_probs[i] as number);
      if (d < 0) expect(b! >= r! && b! >= g!, `token ${i}: difference ${d}, rgb(${r}, ${g}, ${b})`).toBe(true);
      else if (d > 0) expect(r! >= b! && r! >= g!, `token ${i}: difference ${d}, rgb(${r}, ${g}, ${b})`).toBe(true);
      else expect([r, g, b], `token ${i}`).toEqual([255, 255, 255]);
    });
    await drawnAfter(page, () => page.evaluate(`location.hash = ${JSON.stringify(sampleHash)}`));

    // Back to the step, filter by reward: only samples with reward >= 0.5, as many as SQL finds.
    await drawnAfter(page, () => page.locator(".crumbs a", { hasText: `step ${step}` }).click());
    await page.locator('#v-filter input[name="rmin"]').fill("0.5");
    await drawnAfter(page, () => page.locator("#v-apply").click());
    expect(page.url()).toContain("rmin=0.5");
    const rewarded = await q<{ group_id: string; sample_index: number }>(
      "SELECT group_id, sample_index FROM rollout_history WHERE run_id = $1 AND step = $2 AND reward >= 0.5 ORDER BY group_id, sample_index LIMIT 50",
      [runId, step],
    );
    expect(rewarded.length).toBeGreaterThan(0);
    const shown = await attrs(page, "#v-samples tbody tr", "data-sample");
    expect(shown).toEqual(rewarded.map((r) => `${r.group_id}/${r.sample_index}`));
    expect((await attrs(page, "#v-samples tbody tr", "data-reward")).every((r) => Number(r) >= 0.5)).toBe(true);

    // Open the SQL: the samples statement, run as shown through `rlq sql`, gives the rows on the page.
    await page.locator("#v-sql summary").click();
    await page.waitForSelector("#v-sql[open]");
    await page.waitForFunction("location.hash.includes('sql=1')");
    const command = (await page.locator('#v-sql pre[data-name="samples"]').textContent()) ?? "";
    expect(command).toMatch(/^rlq sql "SELECT /);
    expect(command).toContain("h.reward >= 0.5");
    const ran = await runCommand("bash", ["-c", `rlq() { "${process.execPath}" bin/rlq.js "$@"; }; ${command} --json`], {
      cwd: repoRoot,
      env: { ...process.env, ...world.env },
      timeoutMs: 120_000,
    });
    expect(ran.status, ran.stderr).toBe(0);
    const viaCli = JSON.parse(ran.stdout) as Array<{ group_id: string | number; sample_index: number }>;
    expect(viaCli.map((r) => `${r.group_id}/${r.sample_index}`)).toEqual(shown);
    await page.screenshot({ path: join(artifacts, "filter-sql.png"), fullPage: true });

    // Compare two steps from the run page: side by side, each step's numbers as SQL has them.
    await drawnAfter(page, () => page.locator(".crumbs a", { hasText: runId }).click());
    const [a, b] = [steps.at(-1)?.step ?? 0, steps[0]?.step ?? 0];
    await page.locator('#v-compare-form input[name="a"]').fill(String(a));
    await page.locator('#v-compare-form input[name="b"]').fill(String(b));
    await drawnAfter(page, () => page.locator('#v-compare-form button[type="submit"]').click());
    expect(page.url()).toContain(`view=compare&a=${a}&b=${b}`);
    const means = await q<{ step: number; mean: number }>(
      "SELECT step, avg(reward)::float8 AS mean FROM rollout_history WHERE run_id = $1 AND step = ANY($2::int[]) GROUP BY step",
      [runId, [a, b]],
    );
    const meanRow = await page
      .locator("#v-compare tbody tr", { has: page.locator("td", { hasText: /^mean_reward$/ }) })
      .locator("td")
      .allTextContents();
    const meanOf = (s: number) => means.find((m) => m.step === s)?.mean as number;
    expect(Number(meanRow[1])).toBeCloseTo(meanOf(a), 2);
    expect(Number(meanRow[2])).toBeCloseTo(meanOf(b), 2);
    for (const s of [a, b]) {
      const n = await q<{ n: number }>("SELECT count(DISTINCT group_id)::int AS n FROM rollout_history WHERE run_id = $1 AND step = $2", [runId, s]);
      expect(await page.locator(`#v-groups-${s} tbody tr`).count()).toBe(n[0]?.n);
    }
    await page.screenshot({ path: join(artifacts, "compare.png"), fullPage: true });
    expect(pageErrors).toEqual([]);
  });
});
