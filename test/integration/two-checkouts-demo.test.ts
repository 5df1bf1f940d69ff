import { spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { freePort } from "../../src/lib/port-holder.ts";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";
import { ensureEmbeddedPostgres } from "../../src/store/embedded-postgres.ts";
import { repoRoot, waitFor, letPostgresUserIn } from "../helpers/processes.ts";

/**
 * `npm run demo` in two checkouts at once (issue 40): each checkout's RLQ_HOME is `.rlq` in its
 * own directory, and both are given the same embedded Postgres port. The second demo finds the
 * port serving the first checkout's data directory, starts its own server on another port, and
 * both runs learn, each in its own database. Before, the second adopted the first's server (same
 * credentials) and died on ENOENT for .rlq/pg-roles.json (or, had .rlq existed, ran in the other
 * checkout's database).
 *
 * A checkout here is a directory the demo runs in: `npm run demo` is `node <rlq's V8 flags>
 * src/cli/main.ts demo`, which is what bin/rlq.js runs from any directory. DATABASE_URL and
 * REDIS_URL are unset, as on a newcomer's machine: Postgres is embedded and the queues are
 * BullMQ's Postgres backend.
 */
const STEPS = 12;

interface Demo {
  out: () => string;
  exited: Promise<number | null>;
  kill(): void;
}

function startDemo(checkout: string, port: number): Demo {
  const env: NodeJS.ProcessEnv = { ...process.env, RLQ_EMBEDDED_PG_PORT: String(port), RLQ_LOG_LEVEL: "warn" };
  for (const k of ["DATABASE_URL", "REDIS_URL", "RLQ_HOME", "RLQ_QUEUE_PREFIX"]) delete env[k];
  const child = spawn(process.execPath, [...rlqNodeFlags, join(repoRoot, "bin/rlq.js"), "demo", "--set", `num_rollout=${STEPS}`], {
    cwd: checkout,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  return {
    out: () => out,
    exited: new Promise((r) => child.on("close", (code) => r(code))),
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    },
  };
}

/** The demo's step lines: `step  reward  logprob-diff  seconds`. */
function rewards(out: string): number[] {
  return [...out.matchAll(/^\s*(\d+)\s+(-?\d+\.\d{3})\s+\S+\s+\d+\.\d$/gm)].map((m) => Number(m[2]));
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

async function runIds(home: string, port: number): Promise<string[]> {
  const h = await ensureEmbeddedPostgres(home, port);
  try {
    const c = new pg.Client({ connectionString: h.url });
    await c.connect();
    try {
      return (await c.query<{ id: string }>("SELECT id FROM runs ORDER BY id")).rows.map((r) => r.id);
    } finally {
      await c.end();
    }
  } finally {
    await h.close();
  }
}

describe("two checkouts run the demo at once", () => {
  letPostgresUserIn(repoRoot);
  const root = mkdtempSync(join(tmpdir(), "rlq-two-checkouts-"));
  // As root the embedded server runs as the postgres user, which must enter the checkouts.
  chmodSync(root, 0o755);
  const demos: Demo[] = [];
  afterAll(() => {
    for (const d of demos) d.kill();
    // A demo killed here leaves its server running: stop it through its home, as rlq would adopt it.
    for (const checkout of ["checkout-a", "checkout-b"]) {
      const pidFile = join(root, checkout, ".rlq", "pg", "postmaster.pid");
      if (!existsSync(pidFile)) continue;
      try {
        process.kill(Number(readFileSync(pidFile, "utf8").split("\n")[0]), "SIGINT");
      } catch (e) {
        // ESRCH: a stale postmaster.pid, the server is gone already.
        if ((e as { code?: string }).code !== "ESRCH") throw e;
      }
    }
    rmSync(root, { recursive: true, force: true });
  });

  it("each on its own embedded Postgres, and both learn", { timeout: 900_000 }, async () => {
    const [a, b] = [join(root, "checkout-a"), join(root, "checkout-b")];
    mkdirSync(a);
    mkdirSync(b);
    const port = await freePort();
    const demoA = startDemo(a, port);
    demos.push(demoA);
    // The first demo holds the port before the second starts: the collision the issue describes.
    await waitFor("the first demo's run to start", () => /^run (\S+):/m.test(demoA.out()) || demoA.out().includes("Error"), 600_000, 200).catch(
      (e: unknown) => {
        throw new Error(`${String(e)}; the first demo's output so far:\n${demoA.out()}`);
      },
    );
    const demoB = startDemo(b, port);
    demos.push(demoB);
    const [codeA, codeB] = await Promise.all([demoA.exited, demoB.exited]);
    expect(codeA, demoA.out()).toBe(0);
    expect(codeB, demoB.out()).toBe(0);
    expect(demoB.out()).toContain(`port ${port} serves the embedded Postgres of ${join(a, ".rlq", "pg")}`);

    const pgJson = (checkout: string) => JSON.parse(readFileSync(join(checkout, ".rlq", "pg.json"), "utf8")) as { port: number; dataDirectory: string };
    expect(pgJson(a)).toMatchObject({ port, dataDirectory: join(a, ".rlq", "pg") });
    expect(pgJson(b).port).not.toBe(port);
    expect(pgJson(b).dataDirectory).toBe(join(b, ".rlq", "pg"));

    for (const d of [demoA, demoB]) {
      const r = rewards(d.out());
      expect(r, d.out()).toHaveLength(STEPS);
      expect(mean(r.slice(-3)), `rewards ${r.join(" ")}`).toBeGreaterThan(mean(r.slice(0, 3)));
      console.info(
        `demo in ${d === demoA ? "checkout-a" : "checkout-b"}: mean reward, first 3 steps ${mean(r.slice(0, 3)).toFixed(3)} -> last 3 ${mean(r.slice(-3)).toFixed(3)}`,
      );
    }
    // Each checkout's database holds its own run and nothing else.
    const runOf = (d: Demo) => /^run (\S+):/m.exec(d.out())?.[1];
    expect(await runIds(join(a, ".rlq"), port)).toEqual([runOf(demoA)]);
    expect(await runIds(join(b, ".rlq"), port)).toEqual([runOf(demoB)]);
  });
});
