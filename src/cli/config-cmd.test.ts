import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import { afterAll, describe, expect, it } from "vitest";
import { configCommand, type Out } from "./config-cmd.ts";
import { parseRunConfig } from "../config/run-config.ts";
import { parseSlimeScript, shellWords } from "../config/slime-script.ts";

const fixtures = "test/fixtures/slime";
const update = process.env.RLQ_UPDATE_GOLDEN === "1";
const tmp = mkdtempSync(join(tmpdir(), "rlq-config-cmd-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

async function rlqConfig(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = "";
  let stderr = "";
  const out: Out = { stdout: (s) => (stdout += s), stderr: (s) => (stderr += s) };
  const code = await configCommand(args, out);
  return { code, stdout, stderr };
}

/** Compare with the committed golden file (RLQ_UPDATE_GOLDEN=1 rewrites it; review the diff). */
function golden(file: string, actual: string): void {
  if (update || !existsSync(file)) {
    if (!update) throw new Error(`golden file ${file} is missing: run with RLQ_UPDATE_GOLDEN=1 and review it`);
    writeFileSync(file, actual);
  }
  expect(actual).toBe(readFileSync(file, "utf8"));
}

describe("rlq config import-slime on slime's launch scripts (fixtures in slime 624b824's form)", () => {
  for (const name of ["run-qwen3-4B", "run-glm4-9B", "run-moonlight-16B-A3B"]) {
    it(`${name}.sh: a config that validates, and the report, as golden files`, async () => {
      const script = `${fixtures}/${name}.sh`;
      const r = await rlqConfig(["import-slime", script]);
      expect(r.code, r.stderr).toBe(0);
      golden(`${fixtures}/${name}.rlq.yaml`, r.stdout);
      golden(`${fixtures}/${name}.report.txt`, r.stderr);
      expect(r.stderr).toMatch(/^validation: ok$/m);
      // The YAML is a run config as a user would start it.
      const config = parseRunConfig(parseYaml(r.stdout), name, "user");
      expect(config).toMatchObject({
        tokenizer: "hf",
        apply_chat_template: true,
        rollout_shuffle: true,
        use_kl_loss: true,
        kl_loss_type: "low_var_kl",
        eps_clip_high: 0.28,
        adam_beta2: 0.98,
        lr_decay_style: "constant",
        weight_decay: 0.1,
      });
      expect(config.eval_prompt_data).toEqual({ aime: "/root/aime-2024/aime-2024.jsonl" });
      // -o writes the same YAML to a file.
      const file = join(tmp, `${name}.yaml`);
      expect((await rlqConfig(["import-slime", script, "-o", file])).code).toBe(0);
      expect(readFileSync(file, "utf8")).toBe(r.stdout);
    });
  }

  it("reads bash the way the scripts write it: arrays, continuation lines, comments, sourced files, ${VAR} kept", () => {
    const text = [
      'source "${SCRIPT_DIR}/models/m.sh"',
      "A_ARGS=(",
      "   --rollout-batch-size 4   # four prompts",
      "   #--n-samples-per-prompt 2",
      '   --prompt-data "${DATA}/train.jsonl"',
      ")",
      "B_ARGS=(--lr 1e-6 --eval-prompt-data aime '/data/a b.jsonl')",
      "python3 train.py \\",
      "   --colocate \\",
      "   ${M_ARGS[@]} ${A_ARGS[@]} \\",
      '   "${B_ARGS[@]}" ${MISSING_ARGS[@]} --sglang-cuda-graph-bs 1 $(seq 16 8 32)',
    ].join("\n");
    const s = parseSlimeScript(text, (p) => (p === "${SCRIPT_DIR}/models/m.sh" ? "M_ARGS=(\n --num-layers 2\n)" : null));
    expect(s.args).toEqual([
      "--colocate",
      "--num-layers",
      "2",
      "--rollout-batch-size",
      "4",
      "--prompt-data",
      "${DATA}/train.jsonl",
      "--lr",
      "1e-6",
      "--eval-prompt-data",
      "aime",
      "/data/a b.jsonl",
      "--sglang-cuda-graph-bs",
      "1",
      "$(seq 16 8 32)",
    ]);
    expect(s.unresolved).toEqual(["MISSING_ARGS"]);
    expect(shellWords(`--a "x y" 'z' \\$q # c`)).toEqual(["--a", "x y", "z", "$q"]);
  });

  it("train.py's flags given directly: renames, slime's defaults where rlq's differ, unsupported with why, ${VAR} left for the user", async () => {
    const r = await rlqConfig([
      "import-slime",
      "--prompt-data",
      "${DATA_DIR}/train.jsonl",
      "--rollout-batch-size",
      "8",
      "--n-samples-per-prompt",
      "4",
      "--num-rollout",
      "10",
      "--rollout-max-response-len",
      "256",
      "--rm-type",
      "math",
      "--hf-checkpoint",
      "/models/q",
      "--disable-rewards-normalization",
      "--use-tis",
      "--custom-tis-function-path",
      "slime.backends.megatron_utils.loss.icepop_function",
      "--sglang-router-ip",
      "10.0.0.5",
      "--sglang-router-port",
      "3000",
      "--use-routing-replay",
      "--optimizer",
      "sgd",
      "--wandb-project",
      "x",
      "--rollout-function-path",
      "slime.rollout.sglang_rollout.generate_rollout",
      "--freeze-params-name-list",
      "embed",
    ]);
    // Three settings that change what the run does are dropped: the report leads with them, and exits 2.
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(/^DROPPED, changes what the run does \(3\)/);
    expect(r.stderr).toMatch(/^validation: the config validates, but 3 setting\(s\) that change what the run does were dropped \(listed first\)$/m);
    const y = parseYaml(r.stdout) as Record<string, unknown>;
    expect(y).toMatchObject({
      prompt_data: "${DATA_DIR}/train.jsonl",
      rewards_normalization: false,
      use_tis: true,
      tis_function: "icepop",
      engine: { kind: "sglang", router_url: "http://10.0.0.5:3000" },
      lr_decay_style: "linear",
      weight_decay: 0.01,
      label_key: null,
      tokenizer: "hf",
    });
    expect(r.stderr).toMatch(/--disable-rewards-normalization {2}-> {2}rewards_normalization: false/);
    expect(r.stderr).toMatch(/--use-routing-replay: MoE routing replay needs Megatron's router; instead: remove it/);
    expect(r.stderr).toMatch(
      /--rollout-function-path slime.rollout.sglang_rollout.generate_rollout {2}-> {2}\(built in\): null {2}\(slime's default implementation, which is rlq's own\)/,
    );
    expect(r.stderr).toMatch(/--freeze-params-name-list embed: rlq's trainers train every parameter; instead: /);
    expect(y.rollout_function_path).toBeUndefined();
    expect(r.stderr).toMatch(/--optimizer sgd: rlq's trainers use Adam\(W\), not sgd/);
    // rlq has W&B keys of its own (issue 19): slime's --wandb-project maps.
    expect(r.stderr).toMatch(/--wandb-project x {2}-> {2}wandb_project: x/);
    expect(r.stderr).toMatch(/left as written \(1\): expand these before rlq run start\n {2}prompt_data: \$\{DATA_DIR\}\/train.jsonl/);
    expect(r.stderr).toMatch(/lr_decay_style: linear {2}\(Megatron's default \(rlq's is constant\)\)/);
  });

  it("--custom-config-path next to the script is read, and its settings land in the YAML as if given as flags", async () => {
    const dir = join(tmp, "with-custom");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "custom.yaml"), "eps_clip_high: 0.28\nuse_kl_loss: true\nkl_loss_coef: 0.01\nrollout_temperature: 0.7\n");
    const script = join(dir, "run.sh");
    writeFileSync(
      script,
      [
        "ARGS=(",
        "  --prompt-data /d.jsonl --rollout-batch-size 4 --num-rollout 2 --rollout-max-response-len 64",
        "  --rm-type math --hf-checkpoint /m --rollout-temperature 1.0",
        "  --custom-config-path custom.yaml",
        ")",
        "python3 train.py ${ARGS[@]}",
      ].join("\n"),
    );
    const r = await rlqConfig(["import-slime", script]);
    expect(r.code, r.stderr).toBe(0);
    expect(parseYaml(r.stdout)).toMatchObject({ eps_clip_high: 0.28, use_kl_loss: true, kl_loss_coef: 0.01, rollout_temperature: 0.7 });
    expect(r.stderr).toMatch(/^read --custom-config-path custom.yaml: 4 setting\(s\)/m);
    expect(r.stderr).toMatch(/^validation: ok$/m);
  });

  it("a script whose result does not validate exits 2 and says why", async () => {
    const r = await rlqConfig([
      "import-slime",
      "--prompt-data",
      "d.jsonl",
      "--rollout-batch-size",
      "4",
      "--num-rollout",
      "2",
      "--rollout-max-response-len",
      "64",
      "--hf-checkpoint",
      "/m",
      "--custom-rm-path",
      "my_pkg.reward.score",
      "--rollout-function-path",
      "my_pkg.rollout.generate_rollout",
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/validation: FAILED\n[\s\S]*rollout_function_path = "my_pkg.rollout.generate_rollout": a Python path/);
    await expect(rlqConfig(["import-slime", join(tmp, "nope.sh")])).rejects.toThrow(/cannot read .*nope.sh/);
  });
});

describe("rlq config check", () => {
  const base = {
    prompt_data: "data/train.jsonl",
    rollout_batch_size: 4,
    rollout_max_response_len: 32,
    num_rollout: 2,
    rm_type: "math",
    ref_load: "ckpt",
  };
  it("validates, prints the effective config, warns of keys that change nothing and of slime defaults rlq does not share", async () => {
    const file = join(tmp, "run.yaml");
    writeFileSync(file, JSON.stringify({ ...base, kl_loss_coef: 0.1, loss_mask_type: "qwen", tis_clip: 3, eval_top_p: 0.9, lr_decay_style: "constant" }));
    const r = await rlqConfig(["check", file]);
    expect(r.code).toBe(0);
    const effective = parseYaml(r.stdout) as Record<string, unknown>;
    expect(effective).toMatchObject({ rollout_batch_size: 4, n_samples_per_prompt: 1, advantage_estimator: "grpo", eps_clip: 0.2, tokenizer: "bytes" });
    expect(r.stderr.trim().split("\n")).toEqual([
      "warning: loss_mask_type has no effect here: slime uses it only for SFT loss masks, and rlq's mask comes from generation (model tokens 1, tool tokens 0); no rlq setting makes it matter: remove it",
      "warning: kl_loss_coef has no effect here: use_kl_loss is false: no KL loss term is computed; it takes effect with use_kl_loss: true",
      "warning: tis_clip has no effect here: use_tis and get_mismatch_metrics are false: no importance weights are computed; it takes effect with use_tis: true (or get_mismatch_metrics: true)",
      "warning: eval_top_p has no effect here: eval_interval is null, so evals never run; it takes effect with eval_interval: N (and eval_prompt_data)",
      `warning: weight_decay is left out: rlq's default is 0, slime's (Megatron's) is 0.01; write it to be sure which one you get`,
      `warning: label_key is left out: rlq's default is "label", slime's (Megatron's) is null; write it to be sure which one you get`,
    ]);
    const json = await rlqConfig(["check", file, "--json", "--set", "use_kl_loss=true"]);
    expect(JSON.parse(json.stdout).warnings.map((w: { key: string }) => w.key)).toEqual([
      "loss_mask_type",
      "tis_clip",
      "eval_top_p",
      "weight_decay",
      "label_key",
    ]);
  });

  it("an invalid config is refused with the key, the value and what to write", async () => {
    const file = join(tmp, "bad.yaml");
    writeFileSync(file, JSON.stringify({ ...base, disable_rewards_normalization: true }));
    await expect(rlqConfig(["check", file])).rejects.toThrow(/'disable_rewards_normalization': write rewards_normalization: false instead/);
    await expect(rlqConfig(["nope"])).rejects.toThrow(/expected import-slime or check/);
  });
});
