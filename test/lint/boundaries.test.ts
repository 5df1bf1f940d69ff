import { ESLint } from "eslint";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/**
 * Issue 21: the lint's boundaries hold. Each probe is linted as if it were the text of a real file
 * in the folder (lintText with that file's path), so every block of eslint.config.js applies.
 */
const eslint = new ESLint({ cwd: repoRoot });
async function restricted(filePath: string, code: string): Promise<string[]> {
  const [res] = await eslint.lintText(code, { filePath: `${repoRoot}/${filePath}` });
  return (res?.messages ?? []).filter((m) => m.ruleId === "no-restricted-imports").map((m) => m.message);
}

describe("lint: no import cycles (import-x/no-cycle)", () => {
  it("an import that closes a cycle is refused (store/group-view.ts imports store/key-order.ts)", async () => {
    const [res] = await eslint.lintText('import { groupColumns } from "./group-view.ts";\nexport const probe = groupColumns;\n', {
      filePath: `${repoRoot}/src/store/key-order.ts`,
    });
    expect((res?.messages ?? []).filter((m) => m.ruleId === "import-x/no-cycle")).not.toEqual([]);
  });
});

describe("lint: imports come first (import-x/first)", () => {
  it("an import after a statement is refused; the same import before it passes", async () => {
    const after = 'export const n = 1;\nimport { RlqError } from "../lib/errors.ts";\nexport const e = RlqError;\n';
    const before = 'import { RlqError } from "../lib/errors.ts";\nexport const n = 1;\nexport const e = RlqError;\n';
    const first = async (code: string) => {
      const [res] = await eslint.lintText(code, { filePath: `${repoRoot}/src/reward/math.ts` });
      return (res?.messages ?? []).filter((m) => m.ruleId === "import-x/first");
    };
    expect(await first(after)).not.toEqual([]);
    expect(await first(before)).toEqual([]);
  });
});

describe("lint boundaries (eslint.config.js)", () => {
  const io = [
    'import "node:fs";',
    'import "bullmq";',
    'import "ioredis";',
    'import "pg";',
    'import "drizzle-orm";',
    'import "../store/db.ts";',
    'import "../queue/queues.ts";',
  ];
  for (const file of ["src/core/random.ts", "src/algorithms/kl.ts"]) {
    for (const line of io) {
      it(`${file}: ${line} is refused`, async () => {
        expect(await restricted(file, `${line}\nexport const x = 1;\n`)).not.toEqual([]);
      });
    }
  }
  it("bullmq outside queue/, pg outside store/, onnxruntime-node outside engines/ and reward/ are refused; inside, allowed", async () => {
    expect(await restricted("src/controller/draw.ts", 'import "bullmq";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/controller/draw.ts", 'import "pg";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/cli/sql.ts", 'import "onnxruntime-node";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/store/db.ts", 'import "bullmq";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/queue/queues.ts", 'import "pg";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/queue/queues.ts", 'import "bullmq";\nexport const x = 1;\n')).toEqual([]);
    expect(await restricted("src/store/db.ts", 'import "pg";\nexport const x = 1;\n')).toEqual([]);
    expect(await restricted("src/engines/onnx-runtime.ts", 'import "onnxruntime-node";\nexport const x = 1;\n')).toEqual([]);
  });
  it("rollout/, reward/ and trainer/ import neither store/, runtime/, controller/ nor jobs/; the job processors in jobs/ do", async () => {
    const up = ['import "../store/db.ts";', 'import "../runtime/run-context.ts";', 'import "../controller/jobs.ts";', 'import "../jobs/run-train-step.ts";'];
    for (const file of ["src/rollout/custom-generate.ts", "src/reward/math.ts", "src/trainer/batch-codec.ts"]) {
      for (const line of up) expect(await restricted(file, `${line}\nexport const x = 1;\n`)).not.toEqual([]);
    }
    expect(await restricted("src/trainer/embedded/adamw.ts", 'import "../../store/db.ts";\nexport const x = 1;\n')).not.toEqual([]);
    expect(await restricted("src/jobs/run-train-step.ts", 'import "../store/db.ts";\nimport "../runtime/run-context.ts";\nexport const x = 1;\n')).toEqual([]);
  });
});
