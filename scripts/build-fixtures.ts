/**
 * Builds the committed test fixtures (deterministic): a small prompt
 * dataset, and a bad-rows dataset. Run: npx tsx scripts/build-fixtures.ts
 */
import { writeFileSync } from "node:fs";

const rows: string[] = [];
for (let i = 0; i < 64; i++) rows.push(JSON.stringify({ input: `Q${i}: ${i} + ${i % 7} =`, label: String(i + (i % 7)), metadata: { i } }));
writeFileSync("test/fixtures/prompts.jsonl", rows.join("\n") + "\n");

const bad = [
  JSON.stringify({ input: "good 1", label: "1" }),
  "{not json",
  JSON.stringify({ label: "no input" }),
  JSON.stringify(["an", "array"]),
  JSON.stringify({ input: "good 2", label: "2", metadata: "not an object" }),
  JSON.stringify({ input: "good 3", label: "3" }),
];
writeFileSync("test/fixtures/bad-rows.jsonl", bad.join("\n") + "\n");

const evalRows: string[] = [];
for (let i = 0; i < 8; i++) evalRows.push(JSON.stringify({ input: `E${i}: ${i} * 2 =`, label: String(i * 2) }));
writeFileSync("test/fixtures/eval.jsonl", evalRows.join("\n") + "\n");
