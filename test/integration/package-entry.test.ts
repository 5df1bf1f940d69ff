import { mkdtempSync, readdirSync, statSync, symlinkSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { repoRoot, runChecked } from "../helpers/processes.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * The package as a user's script meets it: a project of its own whose node_modules/rlq is this
 * package, a TypeScript file that imports "rlq" (package.json's exports: dist/, which npm install
 * builds), type-checked by tsc against dist's declarations and run by Node through tsx. It runs the
 * demo config to completion with runUntilDone, no CLI involved, then reads it back through
 * watchRun and has a bad amend refused by requestRunChange.
 */
function newestMtime(dir: string): number {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    newest = Math.max(newest, e.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

describe('import ... from "rlq"', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let project: string;
  beforeAll(async () => {
    database = await createTestDatabase("rlq_pkgentry");
    // dist/ is what the package exports: npm install builds it (package.json "prepare"); a checkout
    // whose sources changed since gets it rebuilt, as `npm run build` would.
    const dist = join(repoRoot, "dist/index.js");
    const stale = (() => {
      try {
        return statSync(dist).mtimeMs < newestMtime(join(repoRoot, "src"));
      } catch {
        return true;
      }
    })();
    if (stale)
      await runChecked(process.execPath, [join(repoRoot, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.build.json"], {
        cwd: repoRoot,
        timeoutMs: 600_000,
      });
    project = mkdtempSync(join(tmpdir(), "rlq-user-"));
    mkdirSync(join(project, "node_modules"));
    symlinkSync(repoRoot, join(project, "node_modules/rlq"), "dir");
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "my-rl-script", private: true, type: "module" }));
    writeFileSync(
      join(project, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "es2023",
          module: "nodenext",
          moduleResolution: "nodenext",
          strict: true,
          noEmit: true,
          skipLibCheck: true,
          types: ["node"],
          typeRoots: [join(repoRoot, "node_modules/@types")],
        },
      }),
    );
    writeFileSync(
      join(project, "train.ts"),
      [
        'import { createServices, readEnv, requestRunChange, runUntilDone, waitForChange, watchRun, type ChangeOutcome, type RunProgress, type RunUntilDoneResult } from "rlq";',
        "",
        "const config = process.argv[2] as string;",
        'const result: RunUntilDoneResult = await runUntilDone(config, { set: ["num_rollout=3"], name: "from-a-user-script" });',
        // The finished run through the watch and change API: the watch yields its last state and ends.
        'const s = await createServices(readEnv(), { applicationName: "my-rl-script" });',
        "const watched: RunProgress[] = [];",
        "for await (const p of watchRun(s.db, result.runId)) watched.push(p);",
        'const refused = await requestRunChange(s.db, result.runId, "amend", { lr: 1 }).then(() => "recorded", (e: Error) => e.message);',
        "const wait: (db: typeof s.db, id: number) => Promise<ChangeOutcome> = waitForChange;",
        "await s.close();",
        "console.log(`RESULT ${JSON.stringify({ runId: result.runId, outcome: result.outcome, steps: result.status.trainSteps, status: result.status.status, watched: watched.at(-1), refused, hasWait: typeof wait })}`);",
        'process.exit(result.outcome === "completed" ? 0 : 1);',
        "",
      ].join("\n"),
    );
  }, 700_000);
  afterAll(async () => {
    await database?.drop();
  });

  it("a TypeScript script that imports rlq type-checks against the package's declarations and runs the demo config to completion", async () => {
    await runChecked(process.execPath, [join(repoRoot, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.json"], { cwd: project, timeoutMs: 300_000 });
    const out = await runChecked(
      process.execPath,
      ["--import", join(repoRoot, "node_modules/tsx/dist/loader.mjs"), "train.ts", join(repoRoot, "examples/demo.yaml")],
      {
        cwd: project,
        env: {
          PATH: process.env.PATH ?? "",
          DATABASE_URL: database.url,
          REDIS_URL: redisUrl,
          RLQ_QUEUE_PREFIX: `tpkg${Date.now().toString(36)}`,
          RLQ_HOME: join(project, ".rlq"),
          RLQ_LOG_LEVEL: "warn",
        },
        timeoutMs: 600_000,
      },
    );
    const line = out.split("\n").find((l) => l.startsWith("RESULT "));
    expect(line, out.slice(-3000)).toBeDefined();
    const result = JSON.parse(line!.slice(7)) as { runId: string; outcome: string; steps: number; status: string; refused: string };
    expect(result).toMatchObject({
      outcome: "completed",
      steps: 3,
      status: "completed",
      watched: { runId: result.runId, status: "completed", trainSteps: 3 },
      hasWait: "function",
    });
    expect(result.refused).toMatch(/keys lr cannot be amended on a live run/);
    const rows = await import("pg").then(async ({ default: pg }) => {
      const c = new pg.Client({ connectionString: database.url });
      await c.connect();
      try {
        return (await c.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [result.runId])).rows.map((r) => r.step as number);
      } finally {
        await c.end();
      }
    });
    expect(rows).toEqual([0, 1, 2]);
  }, 900_000);
});
