import { describe, expect, it } from "vitest";
import { parseRunConfig } from "./run-config.ts";
import { formatImportReport, importSlimeArgs } from "./slime-import.ts";

/** slime's SFT recipe (its run-*-sft.sh scripts: sft_rollout, sft_loss, no advantages, train only). */
const sftScript = [
  "--prompt-data",
  "/data/sft.jsonl",
  "--label-key",
  "response",
  "--rollout-batch-size",
  "128",
  "--n-samples-per-prompt",
  "1",
  "--num-epoch",
  "3",
  "--rollout-max-response-len",
  "1024",
  "--rm-type",
  "math",
  "--hf-checkpoint",
  "/models/q",
  "--rollout-function-path",
  "slime.rollout.sft_rollout.generate_rollout",
  "--loss-type",
  "sft_loss",
  "--calculate-per-token-loss",
  "--disable-compute-advantages-and-returns",
  "--debug-train-only",
];

describe("import-slime: an SFT script (--loss-type sft_loss) imports to rlq's SFT run mode", () => {
  it("maps loss_type, takes slime's SFT rollout as built in, drops the advantage and train-only flags", () => {
    const { config, report } = importSlimeArgs(sftScript);
    expect(report.isOk, formatImportReport(report)).toBe(true);
    expect(config).toMatchObject({ loss_type: "sft_loss", calculate_per_token_loss: true, label_key: "response" });
    expect(config).not.toHaveProperty("rollout_function_path");
    expect(report.renamed).toContainEqual(expect.objectContaining({ flag: expect.stringContaining("--rollout-function-path") as string, key: "(built in)" }));
    const dropped = (report.dropped.runtime ?? []).map((d) => d.flag);
    expect(dropped).toEqual(
      expect.arrayContaining([expect.stringContaining("--disable-compute-advantages-and-returns"), expect.stringContaining("--debug-train-only")]),
    );
    expect(parseRunConfig(config, "imported", "user").loss_type).toBe("sft_loss");
  });

  it("outside an SFT script the same flags keep their dispositions: slime's SFT rollout is a module rlq cannot load, --debug-train-only a train-only run on a recorded run", () => {
    const rl = sftScript.filter((w, i) => w !== "--loss-type" && sftScript[i - 1] !== "--loss-type");
    const { report } = importSlimeArgs(rl);
    expect(report.isOk).toBe(false);
    expect(report.unsupported.map((u) => u.flag)).toEqual(expect.arrayContaining([expect.stringContaining("--disable-compute-advantages-and-returns")]));
    expect(report.renamed).toEqual(
      expect.arrayContaining([expect.objectContaining({ flag: expect.stringContaining("--debug-train-only"), key: "debug_rollouts_from" })]),
    );
  });
});
