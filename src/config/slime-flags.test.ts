import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { runConfigSchema } from "./run-config.ts";
import { declaredDisposition, flagToKey, unknownKeyHint } from "./slime-flags.ts";

/**
 * Every flag slime's train.py declares at the commit read (slime/utils/arguments.py,
 * slime/backends/sglang_utils/arguments.py with sglang's ServerArgs as --sglang-* and
 * the router's RouterArgs as --router-*), listed by scripts/extract-slime-flags.py.
 */
const fixture = JSON.parse(readFileSync("test/fixtures/slime-flags-624b824.json", "utf8")) as {
  slime_commit: string;
  count: number;
  flags: Array<{ flag: string; aliases: string[]; source: string }>;
};
const rlqKeys = new Set(Object.keys(runConfigSchema.shape));

describe("slime's declared flags, each with a disposition", () => {
  it("the fixture is slime 624b824's full list, router and SGLang flags included", () => {
    expect(fixture.slime_commit).toBe("624b824a898ab0ec1fcb4d373004c7f3852bf515");
    expect(fixture.flags.length).toBe(fixture.count);
    const sources = new Set(fixture.flags.map((f) => f.source));
    expect([...sources].sort()).toEqual([
      "sglang/srt/server_args.py (prefixed by slime)",
      "sglang_router/router_args.py",
      "slime/backends/sglang_utils/arguments.py",
      "slime/utils/arguments.py",
    ]);
    expect(fixture.flags.filter((f) => f.flag.startsWith("--router-")).length).toBeGreaterThan(90);
  });

  it("0 flags without a disposition (mapped, mapped with a named difference, dropped with why, or unsupported with why and instead)", () => {
    const missing: string[] = [];
    for (const { flag, aliases } of fixture.flags) {
      for (const f of [flag, ...aliases]) {
        const d = declaredDisposition(flagToKey(f), rlqKeys);
        if (d === null) {
          missing.push(f);
          continue;
        }
        if (d.kind === "unsupported") expect(d.why.length * d.instead.length, f).toBeGreaterThan(0);
        if (d.kind === "renamed") expect(d.note, f).not.toBe("");
      }
    }
    expect(missing).toEqual([]);
  });

  it("the issue's eleven, the router's flags, and the entries that were wrong", () => {
    const of = (k: string) => declaredDisposition(k, rlqKeys);
    for (const k of [
      "allgather_cp",
      "balance_by_flops",
      "distributed_backend",
      "distributed_timeout_minutes",
      "padded_vocab_size",
      "qwen_gdn_backend",
      "record_memory_history",
      "prefill_num_servers",
    ])
      expect(of(k)?.kind, k).toBe("dropped");
    expect(of("custom_config_path")?.kind).toBe("read");
    expect(of("custom_model_provider_path")?.kind).toBe("unsupported");
    expect(of("freeze_indexer")?.kind).toBe("unsupported");
    expect(of("router_policy")).toEqual({ kind: "dropped", group: "router", note: "the router's --policy" });
    expect(of("use_dynamic_batch_size")).toMatchObject({ kind: "same", difference: expect.stringMatching(/torch trainer/) });
    expect(of("num_critic_only_steps")).toMatchObject({ kind: "same", difference: expect.stringMatching(/critic/) });
    expect(of("log_probs_chunk_size")).toMatchObject({ kind: "dropped", group: "megatron" });
    expect(of("colocate")).toMatchObject({ kind: "dropped", group: "placement", note: expect.stringMatching(/GPUs of their own/) });
    expect(of("train_backend")).toMatchObject({ kind: "dropped", group: "placement" });
    expect(unknownKeyHint("router_policy", rlqKeys)).toMatch(/drop it: SGLang router: pass these to the router you start.*--policy/);
  });
});
