import { describe, expect, it } from "vitest";
import { stringify } from "yaml";
import { parseRunConfig } from "./run-config.ts";
import { formatImportReport, importSlimeArgs } from "./slime-import.ts";

/** The flags every imported config needs, as a slime script writes them. */
const core = [
  "--prompt-data",
  "/data/train.jsonl",
  "--rollout-batch-size",
  "4",
  "--n-samples-per-prompt",
  "2",
  "--num-rollout",
  "3",
  "--rollout-max-response-len",
  "64",
  "--rm-type",
  "math",
  "--hf-checkpoint",
  "/models/q",
];

describe("import-slime: --custom-config-path", () => {
  it("round-trips a YAML's settings: each one imported as if given on the command line, after it (slime_validate_args applies it last)", () => {
    const settings = {
      eps_clip_high: 0.28,
      use_kl_loss: true,
      kl_loss_type: "low_var_kl",
      rollout_temperature: 0.8,
      eval_pass_k: [1, 4],
      n_samples_per_eval_prompt: 4,
      apply_chat_template_kwargs: { enable_thinking: false },
      num_rollout: 7,
      use_dynamic_batch_size: true,
      max_tokens_per_gpu: 4096,
    };
    const files: Record<string, string> = { "cfg/custom.yaml": stringify(settings) };
    const { config, report } = importSlimeArgs([...core, "--custom-config-path", "cfg/custom.yaml"], { readFile: (p) => files[p] ?? null });
    expect(report.isOk, formatImportReport(report)).toBe(true);
    // Every setting comes back with its value (num_rollout: the file's 7 overrides the flag's 3, as in slime).
    expect(config).toMatchObject(settings);
    const parsed = parseRunConfig(config, "imported", "user");
    for (const [k, v] of Object.entries(settings)) expect(parsed[k as keyof typeof parsed], k).toEqual(v);
    expect(report.customConfigs).toEqual([{ path: "cfg/custom.yaml", settings: 10 }]);
    const text = formatImportReport(report);
    expect(text).toMatch(/^read --custom-config-path cfg\/custom.yaml: 10 setting\(s\), applied after the command line/m);
    expect(text).toMatch(/^ {2}num_rollout: 7 \(from cfg\/custom.yaml\) {2}-> {2}num_rollout: 7$/m);
    expect(text).toMatch(/--custom-config-path cfg\/custom.yaml {2}-> {2}\(read\): 10 settings/);
  });

  it("a YAML's settings get the same dispositions as flags: unsupported ones lead the report, off ones are rlq's behaviour, custom-function arguments are named", () => {
    const files: Record<string, string> = {
      "c.yaml": stringify({ use_routing_replay: true, use_rollout_entropy: false, my_reward_threshold: 0.5, colocate: true, num_layers: 2 }),
    };
    const { report } = importSlimeArgs([...core, "--custom-config-path", "c.yaml"], { readFile: (p) => files[p] ?? null });
    expect(report.isOk).toBe(false);
    expect(report.unsupported.map((u) => u.flag)).toEqual(["use_routing_replay: true (from c.yaml)", "my_reward_threshold: 0.5 (from c.yaml)"]);
    expect(report.unsupported[1]?.why).toMatch(/an argument for your custom functions/);
    expect(report.renamed).toContainEqual(expect.objectContaining({ flag: "use_rollout_entropy: false (from c.yaml)", key: "(off)" }));
    expect(report.dropped.placement?.map((p) => p.flag)).toEqual(["colocate: true (from c.yaml)"]);
    expect(report.dropped.megatron?.map((p) => p.flag)).toEqual(["num_layers: 2 (from c.yaml)"]);
    expect(formatImportReport(report)).toMatch(/^DROPPED, changes what the run does \(2\)/);
  });

  it("a file that cannot be read is dropped by name, and the import is not ok", () => {
    const { report } = importSlimeArgs([...core, "--custom-config-path", "/nowhere.yaml"], { readFile: () => null });
    expect(report.isOk).toBe(false);
    expect(report.unsupported[0]).toMatchObject({
      flag: "--custom-config-path /nowhere.yaml",
      why: expect.stringMatching(/override the command line.*cannot read \/nowhere.yaml/),
    });
    const env = importSlimeArgs([...core, "--custom-config-path", "${CFG}/c.yaml"], { readFile: () => "a: 1" }).report;
    expect(env.unsupported[0]?.why).toMatch(/names an environment variable the importer does not expand/);
  });
});

describe("import-slime: W&B, placement, and what validation: ok means", () => {
  it("--wandb-key ${WANDB_KEY} becomes {env: WANDB_KEY}; --use-wandb without a key reads WANDB_API_KEY; a literal key is never written", () => {
    const withRef = importSlimeArgs([...core, "--use-wandb", "--wandb-project", "p", "--wandb-key", "${WANDB_KEY}"]);
    expect(withRef.config.wandb_key).toEqual({ env: "WANDB_KEY" });
    expect(withRef.report.isOk, formatImportReport(withRef.report)).toBe(true);
    const noKey = importSlimeArgs([...core, "--use-wandb", "--wandb-project", "p"]);
    expect(noKey.config.wandb_key).toEqual({ env: "WANDB_API_KEY" });
    expect(noKey.report.added).toContainEqual(expect.objectContaining({ key: "wandb_key", why: expect.stringMatching(/W&B's SDK reads WANDB_API_KEY/) }));
    expect(noKey.report.isOk).toBe(true);
    const literal = importSlimeArgs([...core, "--use-wandb", "--wandb-project", "p", "--wandb-key", "abc123secret"]);
    expect(literal.config.wandb_key).toEqual({ env: "WANDB_API_KEY" });
    const text = formatImportReport(literal.report);
    expect(text).not.toContain("abc123secret");
    expect(text).toMatch(/--wandb-key \(the key itself, not shown\)/);
    expect(importSlimeArgs([...core, "--use-wandb", "--wandb-mode", "disabled"]).config.use_wandb).toBe(false);
    // --use-wandb alone: slime logs to W&B's default project, and the imported config validates.
    const bare = importSlimeArgs([...core, "--use-wandb"]);
    expect(bare.config.wandb_project).toBe("uncategorized");
    expect(bare.report.added).toContainEqual(expect.objectContaining({ key: "wandb_project", why: expect.stringMatching(/wandb.init\(project=None\)/) }));
    expect(() => parseRunConfig(bare.config)).not.toThrow();
    // The server's keys become the engine's references: rlq sends them, the server you start checks them.
    const keys = importSlimeArgs([...core, "--sglang-api-key", "${SGL_KEY}", "--sglang-admin-api-key", "literal-admin-secret"]);
    expect(keys.config.engine).toMatchObject({ api_key: { env: "SGL_KEY" }, admin_api_key: { env: "SGLANG_ADMIN_API_KEY" } });
    expect(keys.report.isOk, formatImportReport(keys.report)).toBe(true);
    expect(formatImportReport(keys.report)).not.toContain("literal-admin-secret");
  });

  it("placement flags are named with what they change: colocated GPUs become separate ones", () => {
    const { report } = importSlimeArgs([
      ...core,
      "--actor-num-nodes",
      "2",
      "--actor-num-gpus-per-node",
      "4",
      "--colocate",
      "--offload-train",
      "--train-backend",
      "megatron",
    ]);
    expect(report.isOk).toBe(true);
    expect(report.dropped.placement?.map((p) => p.flag)).toEqual([
      "--actor-num-nodes 2",
      "--actor-num-gpus-per-node 4",
      "--colocate",
      "--offload-train",
      "--train-backend megatron",
    ]);
    expect(report.placement).toMatch(/colocated training and SGLang on the same 8 GPU\(s\).*8 GPU\(s\) for the trainer plus 8 for the SGLang servers/);
    expect(formatImportReport(report)).toMatch(/^placement \(5\): slime colocated/m);
  });

  it("every flag of the script is named in the report", () => {
    const args = [
      ...core,
      "--sglang-mem-fraction-static",
      "0.7",
      "--router-policy",
      "round_robin",
      "--num-layers",
      "2",
      "--ci-test",
      "--use-dynamic-batch-size",
    ];
    const text = formatImportReport(importSlimeArgs(args).report);
    for (const a of args.filter((w) => w.startsWith("--"))) expect(text).toContain(a);
    expect(text).toMatch(/--router-policy round_robin {2}\(the router's --policy\)/);
    expect(text).toMatch(/--sglang-mem-fraction-static 0.7 {2}\(the server's --mem-fraction-static\)/);
    expect(text).toMatch(/^validation: ok$/m);
  });

  it("a Megatron flag outside the table and its model-shape patterns is not dropped silently: it blocks validation: ok", () => {
    const { report } = importSlimeArgs([...core, "--lr-warmup-fraction", "0.1", "--some-megatron-thing", "1"]);
    expect(report.isOk).toBe(false);
    expect(report.unsupported.map((u) => u.flag)).toEqual(["--lr-warmup-fraction 0.1", "--some-megatron-thing 1"]);
  });
});

describe("import-slime: evals", () => {
  const evalYaml = [
    "eval:",
    "  defaults:",
    "    n_samples_per_eval_prompt: 4",
    "    temperature: 0.6",
    "    min_new_tokens: 2",
    "  datasets:",
    "    - name: aime",
    "      path: /data/aime.jsonl",
    "      rm_type: math",
    "      prompt_key: problem",
    "      metadata_overrides: {split: test}",
    "    - name: gsm8k",
    "      path: /data/gsm8k.parquet",
    "      n_samples_per_eval_prompt: 1",
    "      top_p: 0.9",
  ].join("\n");

  it("--eval-config: each dataset with its overrides and slime's defaults; a field rlq lacks is named, never dropped unsaid", () => {
    const { config, report } = importSlimeArgs(
      [...core, "--eval-interval", "5", "--eval-prompt-data", "old", "/data/old.jsonl", "--eval-config", "eval.yaml"],
      {
        readFile: (p) => (p === "eval.yaml" ? evalYaml : null),
      },
    );
    expect(config.eval_prompt_data).toEqual({
      aime: {
        path: "/data/aime.jsonl",
        rm_type: "math",
        input_key: "problem",
        metadata_overrides: { split: "test" },
        n_samples_per_eval_prompt: 4,
        temperature: 0.6,
      },
      gsm8k: { path: "/data/gsm8k.parquet", n_samples_per_eval_prompt: 1, top_p: 0.9, temperature: 0.6 },
    });
    expect(report.unsupported.map((u) => u.flag)).toEqual([
      "--eval-config eval.yaml: dataset aime, min_new_tokens",
      "--eval-config eval.yaml: dataset gsm8k, min_new_tokens",
    ]);
    expect(report.isOk).toBe(false);
    expect(report.validation).toBeNull();
    // Without the unsupported default it imports clean, and the config validates.
    const clean = importSlimeArgs(
      [...core, "--eval-interval", "5", "--eval-config", "eval.yaml", "--eval-tool-key", "functions", "--eval-max-prompt-len", "512"],
      {
        readFile: () => evalYaml.replace("    min_new_tokens: 2\n", ""),
      },
    );
    expect(clean.report.unsupported).toEqual([]);
    expect(clean.report.validation).toBeNull();
    expect(parseRunConfig(clean.config)).toMatchObject({ eval_tool_key: "functions", eval_max_prompt_len: 512 });
  });

  it("--eval-config that cannot be read loses its datasets out loud", () => {
    const { report } = importSlimeArgs([...core, "--eval-config", "missing.yaml"], { readFile: () => null });
    expect(report.unsupported).toContainEqual(
      expect.objectContaining({ flag: "--eval-config missing.yaml", why: expect.stringMatching(/eval datasets are lost: cannot read missing.yaml/) }),
    );
    const bad = importSlimeArgs([...core, "--eval-config", "e.yaml"], { readFile: () => "eval:\n  datasets:\n    - path: /x.jsonl\n" });
    expect(bad.report.unsupported[0]?.why).toMatch(/needs a name/);
  });
});

describe("import-slime: Python plugins", () => {
  it("maps slime's dotted reward and filter paths to py: (rlq's Python plugin host), keeps built-in filters; Python rollout functions stay refused", () => {
    const { config, report } = importSlimeArgs([
      ...core,
      "--custom-rm-path",
      "my_rewards.reward_func",
      "--dynamic-sampling-filter-path",
      "my_filters.keep_mixed",
      "--buffer-filter-path",
      "slime.rollout.data_source.pop_first",
    ]);
    expect(config).toMatchObject({ custom_rm_path: "py:my_rewards.reward_func", dynamic_sampling_filter_path: "py:my_filters.keep_mixed" });
    expect(config.buffer_filter_path).toBe("slime.rollout.data_source.pop_first");
    expect(report.mapped.find((m) => m.key === "custom_rm_path")?.difference).toMatch(/Python plugin host/);
    expect(() => parseRunConfig(config, "imported", "user")).not.toThrow();
    expect(importSlimeArgs([...core, "--custom-generate-function-path", "my_agent.generate"]).config.custom_generate_function_path).toBe(
      "py:my_agent.generate",
    );
    const rollout = importSlimeArgs([...core, "--rollout-function-path", "my_pkg.rollout.generate_rollout"]).config;
    expect(() => parseRunConfig(rollout, "imported", "user")).toThrow(/rollout_function_path = "my_pkg.rollout.generate_rollout": a Python path/);
  });
});

describe("import-slime: on-policy distillation", () => {
  it("imports --use-opd, --opd-type sglang and --opd-kl-coef; the teacher's URL is rlq's opd_teacher, and a Megatron teacher is refused", () => {
    const { config, report } = importSlimeArgs([...core, "--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "0.5"]);
    expect(config).toMatchObject({ use_opd: true, opd_type: "sglang", opd_kl_coef: 0.5 });
    expect(report.mapped.find((m) => m.key === "use_opd")?.difference).toMatch(/add opd_teacher: \{kind: sglang\|vllm, url\}/);
    // Without opd_teacher the imported run is refused at validation, naming the key to add.
    expect(report.validation).toMatch(/opd_teacher.*use_opd needs a teacher engine/);
    const megatron = importSlimeArgs([...core, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "/ckpt/teacher"]);
    expect(megatron.report.unsupported).toEqual([
      expect.objectContaining({ flag: "--opd-teacher-load /ckpt/teacher", why: expect.stringMatching(/inside slime's Megatron trainer/) }),
    ]);
  });
});

describe("import-slime: --multimodal-keys", () => {
  it("imports slime's JSON value as multimodal_keys, and the run config accepts it", () => {
    const { config, report } = importSlimeArgs([...core, "--apply-chat-template", "--multimodal-keys", '{"image": "images"}']);
    expect(report.isOk, formatImportReport(report)).toBe(true);
    expect(config.multimodal_keys).toEqual({ image: "images" });
    expect(parseRunConfig(config, "imported", "user").multimodal_keys).toEqual({ image: "images" });
    expect(formatImportReport(report)).toMatch(/multimodal-keys/);
  });

  it("refuses a media type rlq does not read, naming what to write", () => {
    const { config } = importSlimeArgs([...core, "--apply-chat-template", "--multimodal-keys", '{"video": "clips"}']);
    expect(() => parseRunConfig(config, "imported", "user")).toThrow(/only media type rlq reads is image/);
  });
});

describe("import-slime: the debug replay flags (config/debug-keys.ts)", () => {
  it("--debug-rollout-only is debug_rollout_only; --save-debug-rollout-data is dropped (the history is the save)", () => {
    const { config, report } = importSlimeArgs([...core, "--debug-rollout-only", "--save-debug-rollout-data", "/tmp/rollout_{rollout_id}.pt"]);
    expect(report.isOk, formatImportReport(report)).toBe(true);
    expect(config.debug_rollout_only).toBe(true);
    expect(
      Object.values(report.dropped)
        .flat()
        .map((d) => d.flag),
    ).toEqual(expect.arrayContaining([expect.stringContaining("--save-debug-rollout-data")]));
    expect(parseRunConfig(config, "imported", "user").debug_rollout_only).toBe(true);
  });

  it("--debug-train-only becomes debug_rollouts_from with a run id to fill in; --load-debug-rollout-data's files are refused, naming debug_rollouts_from", () => {
    const { config, report } = importSlimeArgs([...core, "--debug-train-only"]);
    expect(config.debug_rollouts_from).toBe("RUN_ID");
    expect(report.added).toEqual(expect.arrayContaining([expect.objectContaining({ key: "debug_rollouts_from", why: expect.stringMatching(/recorded run/) })]));
    expect(parseRunConfig(config, "imported", "user").debug_rollouts_from).toBe("RUN_ID");

    const files = importSlimeArgs([...core, "--debug-train-only", "--load-debug-rollout-data", "/tmp/rollout_{rollout_id}.pt"]).report;
    expect(files.isOk).toBe(false);
    expect(files.unsupported).toEqual([
      expect.objectContaining({ flag: expect.stringContaining("load-debug-rollout-data"), instead: expect.stringMatching(/debug_rollouts_from: RUN_ID/) }),
    ]);
  });

  it("a run config refuses the two debug modes together, and a train-only run in async mode", () => {
    const base = {
      prompt_data: "/data/train.jsonl",
      rollout_batch_size: 4,
      rollout_max_response_len: 16,
      engine: { kind: "sglang", urls: ["http://127.0.0.1:30000"] },
      trainer: { kind: "embedded" },
    };
    expect(() => parseRunConfig({ ...base, debug_rollouts_from: "r1", debug_rollout_only: true }, "c.yaml", "user")).toThrow(
      /debug_rollout_only trains nothing and debug_rollouts_from generates nothing/,
    );
    expect(() => parseRunConfig({ ...base, debug_rollouts_from: "r1", train_async: true }, "c.yaml", "user")).toThrow(
      /debug_rollouts_from runs in sync mode only: set train_async: false/,
    );
  });
});
