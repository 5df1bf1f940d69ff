import { describe, expect, it } from "vitest";
import { parseRunConfig } from "../../config/run-config.ts";

const base = { prompt_data: "prompts.jsonl", rollout_batch_size: 4, rollout_max_response_len: 8, ref_load: "ckpt", num_rollout: 2, rm_type: "math" };

describe("metric sink keys in the run config", () => {
  it("defaults to no sinks", () => {
    const c = parseRunConfig(base, "run.yaml");
    expect(c).toMatchObject({ tensorboard_dir: null, use_wandb: false, wandb_mode: "online", wandb_key: null });
  });

  it("takes wandb_key as a reference and refuses the key itself, saying what to write", () => {
    const ok = parseRunConfig({ ...base, use_wandb: true, wandb_project: "p", wandb_key: { env: "WANDB_API_KEY" } }, "run.yaml");
    expect(ok.wandb_key).toEqual({ env: "WANDB_API_KEY" });
    let message = "";
    try {
      parseRunConfig({ ...base, use_wandb: true, wandb_project: "p", wandb_key: "0123456789abcdef" }, "run.yaml");
    } catch (e) {
      message = (e as Error).message;
    }
    expect(message).toMatch(/wandb_key .*write wandb_key: \{env: WANDB_API_KEY\}/);
    expect(message).not.toContain("0123456789abcdef");
  });

  it("names the missing field when use_wandb lacks a project or (online) a key", () => {
    expect(() => parseRunConfig({ ...base, use_wandb: true, wandb_key: { env: "K" } }, "run.yaml")).toThrow(/wandb_project/);
    expect(() => parseRunConfig({ ...base, use_wandb: true, wandb_project: "p" }, "run.yaml")).toThrow(/wandb_key/);
    expect(parseRunConfig({ ...base, use_wandb: true, wandb_project: "p", wandb_mode: "offline" }, "run.yaml").wandb_mode).toBe("offline");
  });
});
