import { describe, expect, it } from "vitest";
import { checkConfig, checkedKeys } from "./config-check.ts";
import { parseRunConfig, runConfigSchema } from "./run-config.ts";

const embedded = { prompt_data: "d.jsonl", rollout_batch_size: 4, rollout_max_response_len: 32, num_rollout: 2, rm_type: "math", ref_load: "ckpt" };
const remote = {
  prompt_data: "d.jsonl",
  rollout_batch_size: 4,
  rollout_max_response_len: 32,
  num_rollout: 2,
  rm_type: "math",
  hf_checkpoint: "/models/q",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:8700" },
};
const vllm = { ...remote, engine: { kind: "openai", urls: ["http://127.0.0.1:8000"], model: "m" } };

/** The inert keys `raw` writes, keyed by name, with the message (slime-default drift left out). */
function inert(raw: Record<string, unknown>): Record<string, string> {
  const c = parseRunConfig(raw, "run.yaml", "user");
  return Object.fromEntries(
    checkConfig(raw, c)
      .filter((w) => w.message.includes("has no effect here"))
      .map((w) => [w.key, w.message]),
  );
}

const torchOnly = { use_dynamic_batch_size: true, num_critic_only_steps: 2, critic_lr: 1e-5, gradient_checkpointing: true, hf_save_dtype: "bf16" };

describe("rlq config check: keys that change nothing for this trainer, engine and mode", () => {
  it("torch-trainer keys with the embedded trainer: each named, with why and what would make it matter; none with the torch trainer and ppo", () => {
    const w = inert({ ...embedded, ...torchOnly });
    expect(Object.keys(w).sort()).toEqual(Object.keys(torchOnly).sort());
    for (const [key, message] of Object.entries(w))
      expect(message).toBe(
        `${key} has no effect here: only the torch trainer reads it (packing, the PPO critic, memory and Hugging Face output), and trainer.kind is embedded; it takes effect with trainer: {kind: remote, url: ...} served by workers/trainer-torch/server.py`,
      );
    expect(inert({ ...remote, ...torchOnly, advantage_estimator: "ppo" })).toEqual({});
    // With the torch trainer but no critic, the critic's keys are inert for another reason.
    expect(inert({ ...remote, ...torchOnly })).toEqual({
      num_critic_only_steps: expect.stringMatching(
        /only PPO's critic reads it, and advantage_estimator is grpo; it takes effect with advantage_estimator: ppo/,
      ),
      critic_lr: expect.stringMatching(/only PPO's critic reads it/),
    });
  });

  it("engine keys: remote-engine keys with the embedded engine; trainer_push's timeout with vLLM; weight keys with weight_sync none", () => {
    expect(inert({ ...embedded, sglang_server_concurrency: 8, weight_sync: "disk", rollout_health_check_interval: 5 })).toEqual({
      sglang_server_concurrency: expect.stringMatching(
        /configures remote engines .* engine.kind is embedded; it takes effect with engine.kind sglang or openai/,
      ),
      weight_sync: expect.stringMatching(/engine.kind is embedded/),
      rollout_health_check_interval: expect.stringMatching(/engine.kind is embedded/),
    });
    expect(inert({ ...vllm, weight_sync_timeout_s: 60 })).toEqual({
      weight_sync_timeout_s: expect.stringMatching(
        /only trainer_push waits for the engines to report a version, and weight_sync is disk; it takes effect with weight_sync: trainer_push$/,
      ),
    });
    expect(inert({ ...vllm, weight_sync: "trainer_push", weight_sync_timeout_s: 60 })).toEqual({});
    expect(inert({ ...remote, weight_sync: "trainer_push", weight_sync_timeout_s: 60 })).toEqual({});
    expect(inert({ ...remote, weight_sync: "none", update_weights_interval: 2 })).toEqual({
      update_weights_interval: expect.stringMatching(/weight_sync is none: the engines keep their starting weights/),
    });
  });

  it("mode: async-only keys in sync mode, sync-only keys in async mode", () => {
    expect(inert({ ...remote, weight_update_mode: "drain", staleness_policy: "keep", max_regenerations: 3 })).toEqual({
      weight_update_mode: expect.stringMatching(/in sync mode .*; it takes effect with train_async: true/),
      staleness_policy: expect.stringMatching(/no staleness bound is in force/),
      max_regenerations: expect.stringMatching(/staleness_policy is keep; it takes effect with staleness_policy: drop/),
    });
    expect(inert({ ...remote, train_async: true, weight_update_mode: "drain", staleness_policy: "mask", partial_rollout: true })).toEqual({
      partial_rollout: expect.stringMatching(/in async mode surplus groups are discarded.*; it takes effect with train_async: false/),
    });
  });

  it("rewards, distillation, logging, and slime's leftovers", () => {
    expect(
      inert({ ...remote, group_rm: true, opd_kl_coef: 0.5, wandb_project: "p", loss_mask_type: "qwen", num_epoch: 2, plugin_api_key: { env: "K" } }),
    ).toEqual({
      group_rm: expect.stringMatching(/group signature of custom_rm_path.*; it takes effect with custom_rm_path naming a group reward function/),
      opd_kl_coef: expect.stringMatching(/use_opd is false; it takes effect with use_opd: true/),
      wandb_project: expect.stringMatching(/use_wandb is false/),
      loss_mask_type: expect.stringMatching(/no rlq setting makes it matter/),
      num_epoch: expect.stringMatching(/num_rollout is set/),
      plugin_api_key: expect.stringMatching(/no plugin path is an http\(s\):\/\/ URL/),
    });
    expect(inert({ ...embedded, hf_checkpoint: "/models/q" })).toEqual({
      hf_checkpoint: expect.stringMatching(/embedded engine and trainer serve ref_load's model/),
    });
    expect(inert({ ...embedded, hf_checkpoint: "/models/q", tokenizer: "hf" })).toEqual({});
  });

  it("every key a rule covers is a run-config key, and each warning has the form key / why / what makes it matter", () => {
    const keys = new Set(Object.keys(runConfigSchema.shape));
    for (const k of checkedKeys) expect(keys.has(k), k).toBe(true);
    // Written with its default into the plainest embedded config, every covered key either matters there or warns in the set form.
    const shape = runConfigSchema.shape as Record<string, { parse(v: unknown): unknown }>;
    const raw: Record<string, unknown> = { ...embedded };
    for (const k of checkedKeys) if (!(k in raw)) raw[k] = shape[k]?.parse(undefined);
    raw.rm_url = null;
    const warnings = checkConfig(raw, parseRunConfig(raw, "run.yaml", "stored"));
    for (const w of warnings)
      expect(w.message).toMatch(
        new RegExp(`^${w.key} (has no effect here: .+; (it takes effect with .+|no rlq setting makes it matter: remove it)|is left out: .+)$`),
      );
    expect(warnings.length).toBeGreaterThan(40);
  });
});
