import { describe, expect, it } from "vitest";
import { checkAmend } from "./amend.ts";
import { parseRunConfig } from "./run-config.ts";

const current = parseRunConfig({
  prompt_data: "p.jsonl",
  num_rollout: 3,
  rollout_batch_size: 4,
  rollout_max_response_len: 16,
  rm_type: "math",
  ref_load: "ckpt",
});

describe("checkAmend", () => {
  it("returns the amended config for amendable keys with valid values", () => {
    const next = checkAmend({ num_rollout: 5, train_max_attempts: 2 }, current);
    expect(next.num_rollout).toBe(5);
    expect(next.train_max_attempts).toBe(2);
    expect(next.rollout_batch_size).toBe(current.rollout_batch_size);
  });

  it("names a key that cannot be amended, every key that can, and a renamed key's new name", () => {
    expect(() => checkAmend({ lr: 0.1, rollout_batch_size: 8 }, current, "amend of run r1")).toThrow(
      /^amend of run r1: keys lr, rollout_batch_size cannot be amended on a live run \(allowed: num_rollout \(.*\), eval_interval .*; to change anything else, start a new run$/,
    );
    expect(() => checkAmend({ max_attempts: 4 }, current)).toThrow(/'max_attempts' renamed to 'train_max_attempts'/);
  });

  it("names a bad value with the key and what was expected, and refuses an empty amend", () => {
    expect(() => checkAmend({ num_rollout: "ten" }, current)).toThrow(/amend: num_rollout = "ten": /);
    expect(() => checkAmend({}, current)).toThrow(/no keys to change; write the keys and their new values/);
  });
});
