import { describe, expect, it } from "vitest";
import { ConfigError, parseRunConfig } from "./run-config.ts";
import { isPythonPluginPath } from "./slime-traps.ts";

/** A remote-engine config as a slime user writes it (engine and trainer are rlq's). */
const base = {
  prompt_data: "data/train.jsonl",
  rollout_batch_size: 4,
  n_samples_per_prompt: 2,
  rollout_max_response_len: 32,
  num_rollout: 2,
  rm_type: "math",
  engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:8700" },
  hf_checkpoint: "/models/Qwen3-4B",
};
const user = (c: Record<string, unknown>) => parseRunConfig(c, "run.yaml", "user");
const refusal = (c: Record<string, unknown>): string => {
  try {
    user(c);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as ConfigError).message;
  }
  throw new Error("expected a refusal");
};

describe("slime's silent traps: slime's meaning, or a refusal that says what to write", () => {
  it("tokenizer: derived from hf_checkpoint with a remote engine; left out without one, refused", () => {
    expect(user(base).tokenizer).toBe("hf");
    expect(user({ ...base, tokenizer: "bytes" }).tokenizer).toBe("bytes");
    const { hf_checkpoint: _, ...noCkpt } = base;
    expect(refusal(noCkpt)).toMatch(/tokenizer = \(missing\): engine.kind sglang serves a real model.*set hf_checkpoint.*or write tokenizer: bytes/);
    expect(refusal({ ...noCkpt, engine: { kind: "openai", urls: ["http://127.0.0.1:8000"], model: "m" }, weight_sync: "none" })).toMatch(
      /engine.kind openai serves a real model/,
    );
    // The embedded engine keeps its own default: the hf tokenizer is not derived for it.
    expect(user({ ...base, engine: { kind: "embedded" }, trainer: { kind: "embedded" }, ref_load: "ckpt" }).tokenizer).toBe("bytes");
    // A stored config (every key filled in) is not re-judged.
    expect(parseRunConfig({ ...noCkpt }).tokenizer).toBe("bytes");
  });

  it("Python dotted plugin paths are refused with the TS-module or URL alternative; built-in filters by slime's path still work", () => {
    for (const key of ["custom_rm_path", "custom_generate_function_path", "rollout_function_path", "dynamic_sampling_filter_path", "buffer_filter_path"]) {
      expect(refusal({ ...base, [key]: "my_pkg.rewards.compute" })).toMatch(
        new RegExp(`${key} = "my_pkg.rewards.compute": a Python path.*TS/JS module.*http\\(s\\):// URL`),
      );
    }
    expect(refusal({ ...base, custom_rm_path: "plugins/reward.py:score" })).toMatch(/custom_rm_path = "plugins\/reward.py:score": a Python path/);
    expect(
      user({ ...base, dynamic_sampling_filter_path: "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std" })
        .dynamic_sampling_filter_path,
    ).toContain("check_reward_nonzero_std");
    expect(user({ ...base, buffer_filter_path: "slime.rollout.data_source.pop_first" }).buffer_filter_path).toBe("slime.rollout.data_source.pop_first");
    expect(user({ ...base, custom_rm_path: "http://127.0.0.1:9000/reward" }).custom_rm_path).toBe("http://127.0.0.1:9000/reward");
    // slime's default rollout function is rlq's own loop.
    expect(user({ ...base, rollout_function_path: "slime.rollout.sglang_rollout.generate_rollout" }).rollout_function_path).toBeNull();
    expect(isPythonPluginPath("plugins/reward.ts:reward")).toBe(false);
    expect(isPythonPluginPath("reward.mjs")).toBe(false);
    expect(isPythonPluginPath("slime.rollout.rm_hub.math")).toBe(true);
    // py: runs in rlq's Python plugin host: accepted.
    expect(isPythonPluginPath("py:my_rewards.reward_func")).toBe(false);
    expect(user({ ...base, custom_rm_path: "py:plugins/rm.py:reward_func" }).custom_rm_path).toBe("py:plugins/rm.py:reward_func");
    expect(refusal({ ...base, custom_rm_path: "py:rewards" })).toMatch(/custom_rm_path = "py:rewards": expected py:package.module.function/);
    expect(refusal({ ...base, rollout_function_path: "py:agent.rollout" })).toMatch(/rollout_function_path in Python is not run yet/);
    expect(user({ ...base, custom_generate_function_path: "py:agent.generate" }).custom_generate_function_path).toBe("py:agent.generate");
  });

  it("loss_mask_type other than the default, use_opd, and ppo on the embedded trainer are refused at validation", () => {
    expect(refusal({ ...base, loss_mask_type: "qwen3" })).toMatch(
      /loss_mask_type = "qwen3": slime uses loss_mask_type only to build SFT.*remove loss_mask_type/,
    );
    expect(refusal({ ...base, use_opd: true })).toMatch(/opd_teacher = \(missing\): use_opd needs a teacher engine: write opd_teacher: \{kind: sglang\|vllm/);
    const teacher = { kind: "vllm", url: "http://127.0.0.1:8001" };
    expect(refusal({ ...base, use_opd: true, opd_type: "megatron", opd_teacher: teacher })).toMatch(
      /opd_type = "megatron": megatron loads the teacher inside.*write opd_type: sglang/,
    );
    expect(user({ ...base, use_opd: true, opd_type: "sglang", opd_teacher: teacher }).opd_teacher).toEqual({
      ...teacher,
      model: null,
      request_timeout_s: 120,
      wait_s: 600,
    });
    const embedded = { ...base, engine: { kind: "embedded" }, trainer: { kind: "embedded" }, ref_load: "ckpt" };
    expect(refusal({ ...embedded, advantage_estimator: "ppo" })).toMatch(/advantage_estimator = "ppo": ppo needs a critic.*embedded trainer has none/);
    // A remote trainer may declare critic support (the torch trainer): not refused here.
    expect(user({ ...base, advantage_estimator: "ppo" }).advantage_estimator).toBe("ppo");
    // A run stored before these checks existed still loads (only configs as written are judged).
    expect(parseRunConfig({ ...base, tokenizer: "hf", loss_mask_type: "qwen3", use_opd: true }).loss_mask_type).toBe("qwen3");
  });

  it("mis.yaml's keys inlined without tis_function: mis are refused instead of running vanilla TIS", () => {
    const mis = { use_tis: true, tis_level: "sequence", tis_mode: "mask", tis_upper_bound: 2.0 };
    expect(refusal({ ...base, ...mis })).toMatch(
      /tis_level = "sequence": tis_level, tis_mode, tis_upper_bound configure MIS, which runs only with tis_function: mis.*tis_function is left out, so vanilla TIS would run/,
    );
    expect(refusal({ ...base, ...mis, tis_function: "icepop" })).toMatch(/tis_function is "icepop"/);
    expect(user({ ...base, ...mis, tis_function: "mis" }).tis_level).toBe("sequence");
  });

  it("eval_prompt_data in slime's form (name path ...) is read as slime reads it; odd words are refused naming the form", () => {
    const withEval = { ...base, eval_interval: 5 };
    expect(user({ ...withEval, eval_prompt_data: "aime /data/aime.jsonl gsm8k /data/gsm8k.jsonl" }).eval_prompt_data).toEqual({
      aime: "/data/aime.jsonl",
      gsm8k: "/data/gsm8k.jsonl",
    });
    expect(user({ ...withEval, eval_prompt_data: ["aime", "/data/aime.jsonl"] }).eval_prompt_data).toEqual({ aime: "/data/aime.jsonl" });
    expect(refusal({ ...withEval, eval_prompt_data: "/data/aime.jsonl" })).toMatch(/eval_prompt_data = "\/data\/aime.jsonl": slime's form is name\/path pairs/);
  });

  it("an unknown key says what to write instead", () => {
    expect(refusal({ ...base, disable_rewards_normalization: true })).toMatch(
      /unknown key\(s\) 'disable_rewards_normalization' \('disable_rewards_normalization': write rewards_normalization: false instead/,
    );
    expect(refusal({ ...base, optimizer: "adam" })).toMatch(/'optimizer': drop it: Megatron .*Adam\(W\)/);
    expect(refusal({ ...base, micro_batch_size: 1 })).toMatch(/'micro_batch_size': drop it: .*max_tokens_per_gpu/);
    expect(refusal({ ...base, pipeline_model_parallel_size: 2 })).toMatch(/'pipeline_model_parallel_size': drop it: Megatron/);
    expect(refusal({ ...base, sglang_mem_fraction_static: 0.7 })).toMatch(/'sglang_mem_fraction_static': drop it: SGLang launch/);
    expect(refusal({ ...base, colocate: true, train_async: true })).toMatch(/colocate: true takes turns on shared GPUs.*set train_async: false/);
    expect(refusal({ ...base, use_routing_replay: true })).toMatch(/'use_routing_replay': rlq does not support it: MoE routing replay.*; instead: remove it/);
    expect(refusal({ ...base, log_probs_chunk_size: 8 })).toMatch(/'log_probs_chunk_size': drop it: Megatron .*memory only/);
    expect(refusal({ ...base, rollout_batchsize: 4 })).toMatch(/'rollout_batchsize': did you mean 'rollout_batch_size'\?/);
    expect(refusal({ ...base, zzz_qqq: 1 })).toMatch(/unknown key\(s\) 'zzz_qqq'$/m);
  });

  it("num_steps_per_rollout and global_batch_size must agree (slime asserts it); either alone is fine", () => {
    expect(refusal({ ...base, num_steps_per_rollout: 2, global_batch_size: 8 })).toMatch(
      /global_batch_size 8 disagrees with num_steps_per_rollout 2: .* = 4 x 2 \/ 2 = 4/,
    );
    expect(user({ ...base, num_steps_per_rollout: 2, global_batch_size: 4 }).global_batch_size).toBe(4);
    expect(user({ ...base, num_steps_per_rollout: 2 }).num_steps_per_rollout).toBe(2);
  });
});
