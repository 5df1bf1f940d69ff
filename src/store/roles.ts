import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";
import { registerSecret } from "../lib/redact.ts";

/**
 * rlq's Postgres roles (migration 0006; docs/security.md). Roles are cluster-wide, so every rlq
 * database on one server shares them; grants are per database.
 */
export const roles = { owner: "rlq_owner", runtime: "rlq_runtime", reader: "rlq_reader" } as const;

/** The same server and database as `url`, logged in as `user` (with `password`, or none: trust, .pgpass). */
export function urlAs(url: string, user: string, password?: string): string {
  const u = new URL(url);
  u.username = encodeURIComponent(user);
  u.password = password === undefined ? "" : encodeURIComponent(password);
  return u.toString();
}

/**
 * The embedded Postgres authenticates by password. Its runtime and reader roles get random
 * passwords, kept in $RLQ_HOME/pg-roles.json (mode 600) so that every rlq process sharing the
 * server (and `rlq db url`) can log in; set on the server each time its owner starts it.
 */
export async function embeddedRolePasswords(home: string, superUrl: string): Promise<{ runtime: string; reader: string }> {
  const file = join(home, "pg-roles.json");
  let stored: { runtime: string; reader: string } | null = null;
  if (existsSync(file)) stored = JSON.parse(readFileSync(file, "utf8")) as { runtime: string; reader: string };
  if (stored === null) {
    stored = { runtime: randomBytes(18).toString("base64url"), reader: randomBytes(18).toString("base64url") };
    writeFileSync(file, JSON.stringify(stored) + "\n", { mode: 0o600 });
  }
  registerSecret(stored.runtime);
  registerSecret(stored.reader);
  const c = new pg.Client({ connectionString: superUrl });
  await c.connect();
  try {
    // Parameters cannot bind in utility statements; the passwords are base64url, quoted literals are safe.
    await c.query(`ALTER ROLE ${roles.runtime} LOGIN PASSWORD '${stored.runtime}'`);
    await c.query(`ALTER ROLE ${roles.reader} LOGIN PASSWORD '${stored.reader}'`);
  } finally {
    await c.end();
  }
  return stored;
}

/** Whether the session's user is a superuser (rlq warns when it runs as one on a shared server). */
export async function isSuperuser(client: pg.Pool | pg.Client): Promise<boolean> {
  const res = await client.query<{ s: boolean }>("SELECT rolsuper AS s FROM pg_roles WHERE rolname = current_user");
  return res.rows[0]?.s === true;
}

/**
 * The script an admin runs once on a managed Postgres, where the user that runs `rlq migrate` may
 * not create roles, event triggers or revoke catalog functions. Printed by `rlq db admin-sql`.
 */
export function adminSql(database: string): string {
  const db = `"${database.replace(/"/g, '""')}"`;
  return `-- rlq: run once as an admin (a superuser, or the managed service's admin role), then run
-- \`rlq migrate\` with RLQ_OWNER_DATABASE_URL=postgres://rlq_owner:...@HOST/${database}.
-- Replace the three passwords; keep them in your secret store, never in a run config.
CREATE ROLE rlq_owner LOGIN PASSWORD 'CHANGE-ME-owner';
CREATE ROLE rlq_runtime LOGIN PASSWORD 'CHANGE-ME-runtime';
CREATE ROLE rlq_reader LOGIN PASSWORD 'CHANGE-ME-reader';
ALTER ROLE rlq_reader SET default_transaction_read_only = on;
ALTER ROLE rlq_reader SET statement_timeout = '30s';
ALTER ROLE rlq_reader SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE rlq_reader SET lock_timeout = '5s';
GRANT CONNECT, CREATE ON DATABASE ${db} TO rlq_owner;
GRANT CONNECT ON DATABASE ${db} TO rlq_runtime, rlq_reader;
GRANT CREATE ON DATABASE ${db} TO rlq_runtime;   -- BullMQ's Postgres backend schemas (without REDIS_URL)
\\connect ${db}
GRANT CREATE, USAGE ON SCHEMA public TO rlq_owner;

-- After \`rlq migrate\` has run as rlq_owner, as a superuser (rds_superuser, cloudsqlsuperuser...):
--   SET rlq.migrating = on;
--   CREATE EVENT TRIGGER rlq_guard_fact_drop ON sql_drop EXECUTE FUNCTION rlq_guard.guard_fact_ddl();
--   CREATE EVENT TRIGGER rlq_guard_fact_alter ON ddl_command_end
--     WHEN TAG IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'CREATE RULE', 'CREATE POLICY', 'ALTER POLICY')
--     EXECUTE FUNCTION rlq_guard.guard_fact_ddl();
--   SELECT rlq_guard.restrict_functions();
`;
}
