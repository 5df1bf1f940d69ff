import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { readCheckpoint } from "../../src/model/checkpoint.ts";
import { createDemoTokenizer } from "../../src/model/tokenizer.ts";
import { allProblems, answerTokens, exactBoxedReward } from "./task.ts";

describe("demo task", () => {
  it("scores the last \\boxed{} answer by exact match", () => {
    expect(exactBoxedReward("\\boxed{85}", "85")).toBe(1);
    expect(exactBoxedReward("\\boxed{8}\\boxed{85}", "85")).toBe(1);
    expect(exactBoxedReward("\\boxed{085}", "85")).toBe(0);
    expect(exactBoxedReward("85", "85")).toBe(0);
    expect(exactBoxedReward("\\boxed{85", "85")).toBe(0);
  });

  it("generates the same problems from the same seed, and answers fit the demo tokenizer", () => {
    const a = allProblems(1, 10);
    expect(allProblems(1, 10)).toEqual(a);
    expect(a).toHaveLength(100);
    const tok = createDemoTokenizer();
    expect(tok.decode(answerTokens(tok, "198"))).toBe("\\boxed{198}");
  });

  it("ships a warm-start checkpoint and datasets that match the tokenizer", async () => {
    const ckpt = await readCheckpoint(new URL("./warm-start", import.meta.url).pathname);
    expect(ckpt.version).toBe(0);
    expect(ckpt.config.vocab_size).toBe(createDemoTokenizer().vocabSize);
    const first = JSON.parse((await readFile(new URL("./eval.jsonl", import.meta.url), "utf8")).split("\n")[0]!) as { input: string; label: string };
    const [a, b] = first.input.slice(0, -1).split("+").map(Number);
    expect(Number(first.label)).toBe(a! + b!);
  });
});
