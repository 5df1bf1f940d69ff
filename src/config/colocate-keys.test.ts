import { describe, expect, it } from "vitest";
import { parseRunConfig } from "./run-config.ts";
import { effectiveOffload } from "./colocate-keys.ts";

const base = { prompt_data: "d.jsonl", num_rollout: 2, rollout_batch_size: 4, rollout_max_response_len: 32, rm_type: "math", ref_load: "ckpt" };

function refusal(extra: Record<string, unknown>): string {
  try {
    parseRunConfig({ ...base, ...extra }, "run.yaml", "user");
  } catch (e) {
    return String(e instanceof Error ? e.message : e);
  }
  throw new Error("the config parsed");
}

describe("colocate, offload_train, offload_rollout", () => {
  it("default to separate placement with nothing offloaded", () => {
    const c = parseRunConfig(base, "run.yaml", "user");
    expect([c.colocate, c.offload_train, c.offload_rollout]).toEqual([false, null, null]);
    expect(effectiveOffload(c)).toEqual({ train: false, rollout: false });
  });

  it("resolve unset offload flags from colocate, as slime does", () => {
    expect(effectiveOffload({ colocate: true, offload_train: null, offload_rollout: null })).toEqual({ train: true, rollout: true });
    expect(effectiveOffload({ colocate: false, offload_train: null, offload_rollout: null })).toEqual({ train: false, rollout: false });
  });

  it("refuse async mode with colocation, naming why", () => {
    expect(refusal({ colocate: true, train_async: true })).toMatch(/train_async.*generation cannot overlap training: set train_async: false/);
  });

  it.each([
    [{ colocate: true, offload_train: false }, /offload_train.*remove offload_train: false/],
    [{ colocate: true, offload_rollout: false }, /offload_rollout.*remove offload_rollout: false/],
    [{ offload_train: true }, /offload_train.*with colocate: false.*remove offload_train, or set colocate: true/],
    [{ offload_rollout: true }, /offload_rollout.*with colocate: false/],
  ])("refuse %j", (extra, message) => {
    expect(refusal(extra)).toMatch(message);
  });

  const engine = { kind: "sglang", urls: ["http://127.0.0.1:30000"] };
  const sglang = { engine, tokenizer: "bytes" };

  it("accept colocate: true in sync mode with an engine server and weight_sync disk", () => {
    const c = parseRunConfig({ ...base, colocate: true, ...sglang }, "run.yaml", "user");
    expect([c.colocate, effectiveOffload(c)]).toEqual([true, { train: true, rollout: true }]);
  });

  it.each([
    [{}, /engine.*embedded engine has no server: use engine kind sglang/],
    [{ engine, weight_sync: "none" }, /weight_sync.*needs weight_sync: disk, not "none"/],
    [{ engine, update_weights_interval: 2 }, /update_weights_interval 2 cannot hold older weights.*remove it/],
  ])("refuse colocate: true where the engines cannot take turns (%j), saying what to write instead", (extra, message) => {
    expect(refusal({ colocate: true, ...extra })).toMatch(message);
  });
});
