import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify } from "yaml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { repoRoot, spawnFake, spawnRlq, type Proc } from "../helpers/processes.ts";
import { sqlAs, startTlsServices, tlsServicesUnavailable, type TlsServices } from "../helpers/tls-services.ts";

const unavailable = tlsServicesUnavailable();
if (unavailable) process.stderr.write(`tls-auth.test.ts skipped: ${unavailable}\n`);

/**
 * Issue 22, the other doors: Postgres over TLS with passwords (sslmode=verify-full) and Redis over
 * TLS with an ACL user (rediss://), passed through to every rlq process; the three roles log in
 * with passwords; no password reaches a log line or `rlq run status`.
 */
describe.skipIf(unavailable !== null)("rlq over TLS with passwords and least-privilege roles", () => {
  let svc: TlsServices;
  let engine: Proc & { url: string };
  let trainer: Proc & { url: string };
  const runtimePw = `rt-${Math.random().toString(36).slice(2)}`;
  const readerPw = `rd-${Math.random().toString(36).slice(2)}`;
  let env: Record<string, string>;
  const extra: Proc[] = [];

  beforeAll(async () => {
    svc = await startTlsServices();
    await sqlAs(svc.pgUrl("postgres", svc.superPassword, "postgres"), "CREATE DATABASE rlq");
    engine = await spawnFake("test/fakes/fake-sglang.ts", []);
    trainer = await spawnFake("test/fakes/fake-trainer.ts", []);
    env = {
      NODE_EXTRA_CA_CERTS: svc.caFile,
      DATABASE_URL: svc.pgUrl("rlq_runtime", runtimePw, "rlq"),
      RLQ_OWNER_DATABASE_URL: svc.pgUrl("postgres", svc.superPassword, "rlq"),
      RLQ_READER_DATABASE_URL: svc.pgUrl("rlq_reader", readerPw, "rlq"),
      REDIS_URL: svc.redisUrl(),
      RLQ_QUEUE_PREFIX: `ttls${Date.now().toString(36)}`,
      RLQ_LOG_LEVEL: "info",
    };
  });
  afterAll(async () => {
    engine?.kill("SIGTERM");
    trainer?.kill("SIGTERM");
    for (const p of extra) p.kill("SIGTERM");
    await svc?.stop();
  });

  const rlq = async (args: string[], extra: Record<string, string> = {}) => {
    const p = spawnRlq(args, { ...env, ...extra });
    const code = await p.exited;
    return { code, out: p.output() };
  };
  const secrets = () => [svc.superPassword, svc.redisPassword, runtimePw, readerPw];

  it("migrates as the owner, runs a run as rlq_runtime, reads it as rlq_reader, all over TLS", async () => {
    // As on a managed server: an admin makes the login roles with passwords (rlq db admin-sql), then rlq migrate.
    await sqlAs(
      svc.pgUrl("postgres", svc.superPassword, "rlq"),
      `CREATE ROLE rlq_runtime LOGIN PASSWORD '${runtimePw}'; CREATE ROLE rlq_reader LOGIN PASSWORD '${readerPw}'`,
    );
    const mig = await rlq(["migrate"]);
    expect(mig.code, mig.out).toBe(0);

    // Without TLS the server refuses (pg_hba: hostnossl reject), so the run below did use TLS.
    await expect(sqlAs(svc.pgUrl("rlq_runtime", runtimePw, "rlq").replace(/\?.*$/, "?sslmode=disable"), "SELECT 1")).rejects.toThrow(
      /no pg_hba.conf entry|reject/,
    );

    const config = join(mkdtempSync(join(tmpdir(), "rlq-tls-run-")), "run.yaml");
    writeFileSync(
      config,
      stringify({
        prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
        rollout_batch_size: 2,
        n_samples_per_prompt: 2,
        over_sampling_batch_size: 3,
        num_rollout: 2,
        rollout_max_response_len: 16,
        custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
        engine: { kind: "sglang", urls: [engine.url] },
        tokenizer: "bytes",
        trainer: { kind: "remote", url: trainer.url },
      }),
    );
    const start = await rlq(["run", "start", "--config", config]);
    expect(start.code, start.out).toBe(0);
    const runId = start.out.trim().split("\n").pop() as string;
    const up = await rlq(["up", "--run", runId, "--exit-when-done"]);
    expect(up.code, up.out).toBe(0);
    expect(up.out).not.toMatch(/as a superuser/);

    const sql = await rlq(["sql", `SELECT count(*)::int AS n FROM train_steps WHERE run_id = '${runId}'`, "--json"]);
    expect(sql.code, sql.out).toBe(0);
    expect(sql.out).not.toMatch(/Warning/);
    expect(JSON.parse(sql.out.slice(sql.out.indexOf("[\n"), sql.out.lastIndexOf("]") + 1))).toEqual([{ n: 2 }]);
    const status = await rlq(["run", "status", runId, "--json"]);
    expect(status.code, status.out).toBe(0);
    const url = await rlq(["db", "url"]);
    expect(url.out.trim().split("\n").pop()).toBe(env.RLQ_READER_DATABASE_URL);

    // The same over BullMQ's Postgres backend (no REDIS_URL): its pool gets the TLS URL too.
    // Fresh fakes: a run starts at weight version 0, and the first run moved these to 2.
    const engine2 = await spawnFake("test/fakes/fake-sglang.ts", []);
    const trainer2 = await spawnFake("test/fakes/fake-trainer.ts", []);
    extra.push(engine2, trainer2);
    const pgQueue = { REDIS_URL: "", RLQ_QUEUE_PREFIX: `ttlspg${Date.now().toString(36)}` };
    const start2 = await rlq(
      ["run", "start", "--config", config, "--set", "num_rollout=1", "--set", `engine.urls=["${engine2.url}"]`, "--set", `trainer.url=${trainer2.url}`],
      pgQueue,
    );
    expect(start2.code, start2.out).toBe(0);
    const up2 = await rlq(["up", "--run", start2.out.trim().split("\n").pop() as string, "--exit-when-done"], pgQueue);
    expect(up2.code, up2.out).toBe(0);

    for (const out of [mig.out, start.out, up.out, sql.out, status.out, start2.out, up2.out]) for (const s of secrets()) expect(out).not.toContain(s);
  });

  it("a process of a role that may not migrate an unmigrated database says what to run", async () => {
    await sqlAs(svc.pgUrl("postgres", svc.superPassword, "postgres"), "CREATE DATABASE rlq_fresh");
    const res = await rlq(["run", "status", "rnone"], {
      DATABASE_URL: svc.pgUrl("rlq_runtime", runtimePw, "rlq_fresh"),
      RLQ_OWNER_DATABASE_URL: "",
    });
    expect(res.code).not.toBe(0);
    expect(res.out).toMatch(/has never been migrated.*Run `rlq migrate` with RLQ_OWNER_DATABASE_URL/s);
    for (const s of secrets()) expect(res.out).not.toContain(s);
  });

  it("a superuser DATABASE_URL on a shared server draws a warning", async () => {
    const res = await rlq(["run", "status", "rnone"], { DATABASE_URL: svc.pgUrl("postgres", svc.superPassword, "rlq") });
    expect(res.out).toMatch(/warning: .* as a superuser/);
    expect(res.out).not.toContain(svc.superPassword);
  });
});
