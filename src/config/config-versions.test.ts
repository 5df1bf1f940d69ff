import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  CONFIG_VERSION,
  CONFIG_VERSION_KEY,
  configUpgrades,
  renamedKeyAdvice,
  renameKeys,
  upgradeRecordedConfig,
  withConfigVersion,
  type ConfigUpgrade,
} from "./config-versions.ts";
import { applyRecordedChanges, decodeRecordedConfig } from "./recorded-config.ts";
import { ConfigError, parseRunConfig } from "./run-config.ts";
import { RlqError } from "../lib/errors.ts";

const userConfig = {
  prompt_data: "p.jsonl",
  rm_type: "math",
  rollout_batch_size: 2,
  n_samples_per_prompt: 2,
  num_rollout: 3,
  rollout_max_response_len: 16,
  engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:2" },
  tokenizer: "bytes",
};

/** The config a run recorded at version 1 (scripts/record-decision-logs.ts, before the rename). */
function recordedV1(): Record<string, unknown> {
  const log = JSON.parse(readFileSync(join(import.meta.dirname, "../../test/fixtures/decision-logs/sync-partial.json"), "utf8")) as Array<{
    payload: { config: Record<string, unknown> };
  }>;
  const config = log[0]?.payload.config;
  if (!config) throw new Error("sync-partial.json has no run.created");
  return config;
}

function thrown(f: () => unknown): RlqError {
  try {
    f();
  } catch (e) {
    if (e instanceof RlqError) return e;
    throw e;
  }
  throw new Error("expected an RlqError, nothing was thrown");
}

/** A chain of three steps that test the order: a rename, a rename of the renamed key, a value rewrite. */
const testChain: ConfigUpgrade[] = [
  { from: 1, why: "a", renamed: { a: "b" }, upgrade: (c) => renameKeys(c, { a: "b" }) },
  { from: 2, why: "b", renamed: { b: "c" }, upgrade: (c) => renameKeys(c, { b: "c" }) },
  {
    from: 3,
    why: "c in tenths",
    renamed: {},
    upgrade: (c) => ("c" in c ? { ...c, c: (c.c as number) * 10 } : { ...c }),
  },
];

describe("the config version chain", () => {
  it("is numbered without gaps, each step upgrading its index + 1, up to CONFIG_VERSION", () => {
    expect(configUpgrades.map((u) => u.from)).toEqual([...configUpgrades.keys()].map((i) => i + 1));
    expect(CONFIG_VERSION).toBe(configUpgrades.length + 1);
  });

  it("runs every step from the recorded version up, in order, and drops the version key", () => {
    expect(upgradeRecordedConfig({ a: 1, x: "kept" }, "t", testChain)).toEqual({ c: 10, x: "kept" });
    expect(upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: 1, a: 1 }, "t", testChain)).toEqual({ c: 10 });
    expect(upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: 2, b: 2 }, "t", testChain)).toEqual({ c: 20 });
    expect(upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: 3, c: 3 }, "t", testChain)).toEqual({ c: 30 });
    // The current version passes untouched.
    expect(upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: 4, c: 4 }, "t", testChain)).toEqual({ c: 4 });
  });

  it("upgrades an amendment's partial changes without adding keys, and never mutates what it is given", () => {
    const changes = Object.freeze({ x: 1 });
    expect(upgradeRecordedConfig(changes, "t", testChain)).toEqual({ x: 1 });
    const frozen = Object.freeze({ max_attempts: 5 });
    expect(upgradeRecordedConfig(frozen, "t")).toEqual({ train_max_attempts: 5 });
    expect(frozen).toEqual({ max_attempts: 5 });
  });

  it("refuses a config from a newer rlq, naming the version it has and the versions this rlq knows", () => {
    const e = thrown(() => upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: CONFIG_VERSION + 1, a: 1 }, "run r1 stored config"));
    expect(e.code).toBe("config_version_unknown");
    expect(e.message).toContain(`run r1 stored config: config_version = ${CONFIG_VERSION + 1}`);
    expect(e.message).toContain(`config versions 1 to ${CONFIG_VERSION}`);
    expect(e.message).toContain("recorded by a newer rlq");
    expect(e.isRetriable).toBe(false);
  });

  it("refuses a version that is not a positive integer, and a recorded config that is not an object", () => {
    for (const v of [0, -1, 1.5, "2", null]) {
      const e = thrown(() => upgradeRecordedConfig({ [CONFIG_VERSION_KEY]: v }, "snap"));
      expect(e.code, String(v)).toBe("config_invalid");
      expect(e.message).toContain(`snap: config_version = ${JSON.stringify(v)}: expected a positive integer`);
    }
    for (const c of [null, [], "x", 3]) expect(thrown(() => upgradeRecordedConfig(c, "snap")).code).toBe("config_invalid");
  });

  it("refuses a chain with a gap as a bug, not as the user's mistake", () => {
    const gap = [testChain[0], testChain[2]] as ConfigUpgrade[];
    expect(thrown(() => upgradeRecordedConfig({ a: 1 }, "t", gap, 4)).code).toBe("invariant_violated");
  });
});

describe("decoding a recorded config", () => {
  it("decodes a config recorded at version 1 (max_attempts) to today's shape", () => {
    const v1 = recordedV1();
    expect(v1).toHaveProperty("max_attempts", 3);
    expect(v1).not.toHaveProperty(CONFIG_VERSION_KEY);
    // Today's schema alone refuses it: the key is gone.
    expect(() => parseRunConfig(v1, "stored")).toThrow(/unknown key\(s\) 'max_attempts'/);
    const decoded = decodeRecordedConfig({ ...v1, max_attempts: 7 }, "run r stored config");
    expect(decoded.train_max_attempts).toBe(7);
    expect(decoded).not.toHaveProperty("max_attempts");
    expect(decoded).not.toHaveProperty(CONFIG_VERSION_KEY);
  });

  it("round-trips what this rlq records", () => {
    const parsed = parseRunConfig(userConfig, "c", "user");
    const recorded = withConfigVersion(parsed);
    expect(recorded[CONFIG_VERSION_KEY]).toBe(CONFIG_VERSION);
    expect(decodeRecordedConfig(JSON.parse(JSON.stringify(recorded)), "c")).toEqual(parsed);
  });

  it("applies an amendment recorded under the old key name, and one recorded at today's version", () => {
    const parsed = parseRunConfig(userConfig, "c", "user");
    expect(applyRecordedChanges(parsed, { max_attempts: 9 }, "a").train_max_attempts).toBe(9);
    expect(applyRecordedChanges(parsed, withConfigVersion({ train_max_attempts: 4, num_rollout: 5 }), "a")).toMatchObject({
      train_max_attempts: 4,
      num_rollout: 5,
    });
  });
});

describe("a config written by hand with a renamed key", () => {
  it("is refused with the new name and the reason", () => {
    expect(renamedKeyAdvice("max_attempts")).toMatch(/^renamed to 'train_max_attempts' \(config version 2\): it bounds the train job's attempts/);
    expect(renamedKeyAdvice("rollout_batch_size")).toBeNull();
    let message = "";
    try {
      parseRunConfig({ ...userConfig, max_attempts: 2 }, "run.yaml", "user");
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
      message = (e as Error).message;
    }
    expect(message).toContain("run.yaml: unknown key(s) 'max_attempts' ('max_attempts': renamed to 'train_max_attempts' (config version 2)");
  });
});
