import { join } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { readOnlyQuery, streamReadOnlyQuery } from "../../src/store/read-only.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { asRole, createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * Issue 22: `rlq sql` must not be a superuser shell, and facts must not be erased by accident.
 * Every hostile statement is refused with a message that says why, and the catalog, every table's
 * rows, the large objects and the other sessions are the same before and after.
 */
describe("rlq sql and the fact guards under hostile input", () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Db;
  let admin: pg.Client;
  let bystander: pg.Client;
  let runId: string;

  const q = async (url: string, sql: string) => {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      return await c.query(sql);
    } finally {
      await c.end();
    }
  };

  /** What hostile SQL could change: the catalog of rlq's objects, roles, rows, large objects. */
  const snapshot = async (): Promise<string> => {
    const parts: unknown[] = [];
    const one = async (sql: string) => parts.push((await admin.query(sql)).rows);
    await one(`SELECT c.relname, c.relkind, pg_get_userbyid(c.relowner) AS owner, c.relacl::text AS acl
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'rlq_guard', 'drizzle') ORDER BY 1, 2`);
    await one("SELECT rolname, rolsuper, rolcreaterole, rolcanlogin, rolconfig::text FROM pg_roles ORDER BY 1");
    await one("SELECT tgname, tgenabled, tgrelid::regclass::text AS rel FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 3");
    await one("SELECT evtname, evtenabled FROM pg_event_trigger ORDER BY 1");
    await one("SELECT count(*)::int AS n FROM pg_largeobject_metadata");
    await one("SELECT extname FROM pg_extension ORDER BY 1");
    await one("SELECT p.oid::regprocedure::text AS f, p.proacl::text FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1");
    const tables = (
      await admin.query<{ t: string }>(
        "SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables WHERE schemaname IN ('public', 'rlq_guard') ORDER BY 1",
      )
    ).rows;
    for (const { t } of tables)
      await one(`SELECT '${t}' AS t, count(*)::int AS n, md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) AS h FROM ${t} x`);
    return JSON.stringify(parts);
  };

  beforeAll(async () => {
    database = await createTestDatabase("rlq_sqlsec");
    db = createDb(database.url, { max: 2 });
    admin = new pg.Client({ connectionString: database.adminUrl });
    await admin.connect();
    // A function with a side effect that the reader could call if EXECUTE were all it took.
    await admin.query("CREATE TABLE side_effects (at timestamptz DEFAULT now())");
    await admin.query("CREATE FUNCTION side_effect() RETURNS int LANGUAGE sql AS 'INSERT INTO side_effects DEFAULT VALUES RETURNING 1'");
    ({ runId } = await startRun(db, {
      config: {
        prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
        rollout_batch_size: 2,
        n_samples_per_prompt: 2,
        num_rollout: 1,
        rollout_max_response_len: 8,
        custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
        engine: { kind: "sglang", urls: ["http://127.0.0.1:9"] },
        tokenizer: "bytes",
        trainer: { kind: "remote", url: "http://127.0.0.1:9" },
      },
    }));
    // Another session (as a controller would hold): it must survive everything below.
    bystander = new pg.Client({ connectionString: database.url });
    await bystander.connect();
  });
  afterAll(async () => {
    await bystander?.end().catch(() => undefined);
    await admin?.end();
    await db?.close();
    await database?.drop();
  });

  it("reads the documented tables and views, one statement at a time, with comments and parentheses", async () => {
    const r = await readOnlyQuery(database.readerUrl, "-- the run\n/* a /* nested */ comment */ (SELECT id, status FROM runs)");
    expect(r.rows).toEqual([{ id: runId, status: "running" }]);
    expect((await readOnlyQuery(database.readerUrl, "SELECT count(*)::int AS n FROM prompt_draws")).rows).toEqual([{ n: 0 }]);
    expect((await readOnlyQuery(database.readerUrl, "show statement_timeout")).rows).toEqual([{ statement_timeout: "30s" }]);
    expect((await readOnlyQuery(database.readerUrl, "explain select * from decisions")).rows.length).toBeGreaterThan(0);
    const many = await readOnlyQuery(database.readerUrl, "select g from generate_series(1, 2500) g", { maxRows: 1200, batchRows: 500 });
    expect(many.rows.length).toBe(1200);
    expect(many.isTruncated).toBe(true);
  });

  const hostile: Array<[string, RegExp]> = [
    ["commit; drop table decisions cascade", /read-only queries only.*got COMMIT/],
    ["select 1; drop table decisions cascade", /one statement per call/],
    ["select 1; commit; create role evil superuser login password 'x'", /one statement per call/],
    ["commit; create role evil superuser login password 'x'", /got COMMIT/],
    ["copy (select 1) to program 'touch /tmp/rlq-pwned'", /got COPY/],
    ["select pg_read_file('/etc/hostname')", /permission denied for function pg_read_file/],
    ["select pg_read_binary_file('/etc/hostname')", /permission denied for function pg_read_binary_file/],
    ["select * from pg_ls_dir('.')", /permission denied for function pg_ls_dir/],
    ["select lo_import('/etc/hostname')", /permission denied for function lo_import/],
    ["select lo_creat(-1)", /permission denied for function lo_creat/],
    ["select lo_from_bytea(0, 'x')", /permission denied for function lo_from_bytea/],
    ["select pg_terminate_backend(pid) from pg_stat_activity where pid <> pg_backend_pid()", /permission denied for function pg_terminate_backend/],
    ["select pg_cancel_backend(pid) from pg_stat_activity", /permission denied for function pg_cancel_backend/],
    ["select pg_advisory_lock(727001)", /permission denied for function pg_advisory_lock/],
    ["set role postgres", /got SET/],
    ["set session authorization postgres", /got SET/],
    ["reset role", /got RESET/],
    ["set transaction read write", /got SET/],
    ["select set_config('role', 'postgres', false)", /permission denied to set role|must be member|permission denied/],
    ["select set_config('session_authorization', 'postgres', false)", /permission denied|must be superuser/],
    ["select set_config('transaction_read_only', 'off', true), 1", /read-write mode must be set before any query|read-only/],
    ["do $$ begin execute 'drop table decisions cascade'; end $$", /got DO/],
    ["with x as (delete from decisions returning *) select * from x", /read-only|permission denied/],
    ["explain analyze delete from decisions", /read-only|permission denied/],
    ["select side_effect()", /read-only|permission denied/],
    ["select * from run_leases", /permission denied for table run_leases/],
    ["select * from side_effects", /permission denied for table side_effects/],
    ["create table x (a int)", /got CREATE/],
    ["insert into decisions select * from decisions", /got INSERT/],
    ["truncate decisions", /got TRUNCATE/],
    ["drop table decisions", /got DROP/],
    ["alter table decisions disable trigger all", /got ALTER/],
    ["create extension dblink", /got CREATE/],
    ["select dblink_exec('dbname=postgres', 'drop table decisions')", /function dblink_exec.*does not exist/],
    ["select pg_notify('rlq', 'x')", /permission denied for function pg_notify/],
    ["select pg_reload_conf()", /permission denied for function pg_reload_conf/],
    ["vacuum full decisions", /got VACUUM/],
    ["listen rlq", /got LISTEN/],
    ["", /the query is empty/],
  ];

  it("refuses every hostile statement with a clear message, and changes nothing", async () => {
    const before = await snapshot();
    for (const [sql, message] of hostile) {
      await expect(streamReadOnlyQuery(database.readerUrl, sql), sql).rejects.toThrow(message);
    }
    // A statement that never ends is cancelled at the timeout.
    await expect(streamReadOnlyQuery(database.readerUrl, "select pg_sleep(3600)", { timeoutMs: 300 })).rejects.toThrow(
      /ran past its timeout and was cancelled/,
    );
    await expect(
      streamReadOnlyQuery(database.readerUrl, "select set_config('statement_timeout', '0', true), pg_sleep(3600)", { timeoutMs: 300 }),
    ).rejects.toThrow(/timeout/);
    expect(await snapshot()).toBe(before);
    expect((await bystander.query("SELECT 1 AS ok")).rows).toEqual([{ ok: 1 }]);
    expect((await admin.query("SELECT count(*)::int AS n FROM pg_roles WHERE rolname = 'evil'")).rows).toEqual([{ n: 0 }]);
  });

  it("refuses to run user SQL through a URL that may write facts", async () => {
    await expect(readOnlyQuery(database.url, "select 1")).rejects.toThrow(/logs in as rlq_runtime, who may write facts/);
    await expect(readOnlyQuery(database.adminUrl, "select 1")).rejects.toThrow(/logs in as postgres, who is a superuser/);
  });

  it("the CLI runs as rlq_reader: a hostile statement is refused, a query streams, db url prints the reader's URL", async () => {
    const env = { DATABASE_URL: database.url, REDIS_URL: redisUrl, RLQ_QUEUE_PREFIX: `tsqlsec${Date.now().toString(36)}`, RLQ_LOG_LEVEL: "warn" };
    const before = await snapshot();
    const bad = spawnRlq(["sql", "commit; drop table decisions cascade"], env);
    expect(await bad.exited).toBe(1);
    expect(bad.output()).toMatch(/read-only queries only/);
    const ok = spawnRlq(["sql", "select g from generate_series(1, 30) g", "--json", "--limit", "20"], env);
    expect(await ok.exited, ok.output()).toBe(0);
    expect(ok.output()).toMatch(/stopped at --limit 20/);
    const json = ok.output().slice(ok.output().indexOf("["), ok.output().lastIndexOf("]") + 1);
    expect(JSON.parse(json)).toHaveLength(20);
    const url = spawnRlq(["db", "url"], env);
    expect(await url.exited).toBe(0);
    expect(url.output().trim().split("\n").pop()).toBe(asRole(database.adminUrl, "rlq_reader"));
    expect(await snapshot()).toBe(before);
  });

  it("TRUNCATE, DROP and ALTER of a fact table fail for the runtime and reader roles, for the owner, and for a superuser outside migrations", async () => {
    const attempts = [
      "TRUNCATE decisions",
      "TRUNCATE sample_segments CASCADE",
      "DROP TABLE decisions CASCADE",
      "ALTER TABLE decisions DISABLE TRIGGER ALL",
      "ALTER TABLE train_steps RENAME TO t2",
      "DROP TRIGGER decisions_insert_only ON decisions",
    ];
    const before = await snapshot();
    for (const sql of attempts) {
      await expect(q(database.url, sql), `runtime: ${sql}`).rejects.toThrow(/permission denied|must be owner|forbidden/);
      await expect(q(asRole(database.adminUrl, "rlq_reader"), sql), `reader: ${sql}`).rejects.toThrow(/permission denied|must be owner|read-only/);
      await expect(admin.query(`SET ROLE rlq_owner; ${sql}`), `owner: ${sql}`).rejects.toThrow(/forbidden/);
      await admin.query("RESET ROLE");
      await expect(admin.query(sql), `superuser: ${sql}`).rejects.toThrow(/forbidden/);
    }
    expect(await snapshot()).toBe(before);
  });
});
