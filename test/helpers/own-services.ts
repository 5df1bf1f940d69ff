import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { appendFileSync, chownSync, existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";

/**
 * A Postgres and a Redis of the test's own (own data directory, own address and port), for the
 * fault tests that restart, kill or flush them: the shared services on 127.0.0.1 are never
 * touched. Each runs in the foreground as a child (optionally inside a network namespace), so a
 * restart is a signal to a process this test started. Postgres runs as the `postgres` user
 * (it refuses root); `setpriv` execs, so the child's pid is the postmaster's.
 */
const PG_BIN = process.env.RLQ_PG_BIN ?? "/usr/lib/postgresql/15/bin";

export function ownServicesAvailable(): string | null {
  if (process.getuid?.() !== 0) return "not root (the own Postgres runs as the postgres user)";
  if (!existsSync(join(PG_BIN, "postgres"))) return `no Postgres binaries at ${PG_BIN} (set RLQ_PG_BIN)`;
  if (spawnSync("id", ["postgres"]).status !== 0) return "no postgres user";
  if (spawnSync("redis-server", ["--version"]).status !== 0) return "no redis-server";
  if (spawnSync("setpriv", ["--help"], { stdio: "ignore" }).status !== 0) return "no setpriv";
  return null;
}

function prefix(netns: string | null): string[] {
  return netns ? ["ip", "netns", "exec", netns] : [];
}

function run(argv: string[], what: string): void {
  const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`${what}: ${argv.join(" ")} exited ${r.status}: ${r.stderr}${r.stdout}`);
}

export interface OwnProcess {
  /** Start (again). */
  start: () => Promise<void>;
  /** Signal and wait for the exit. */
  stop: (signal: NodeJS.Signals) => Promise<void>;
  readonly running: boolean;
  log: () => string;
}

function foreground(argv: () => string[], ready: (out: string) => boolean, what: string): OwnProcess {
  let child: ChildProcess | null = null;
  let out = "";
  let exited: Promise<void> = Promise.resolve();
  return {
    get running() {
      return child !== null;
    },
    log: () => out,
    async start() {
      if (child) return;
      const a = argv();
      const c = spawn(a[0] as string, a.slice(1), { stdio: ["ignore", "pipe", "pipe"] });
      child = c;
      // Readiness is judged on this start's output only: the log keeps every start's lines, and
      // an earlier start's "ready" line once let a restart return before the server listened
      // (the cluster test's FLUSHALL then met a Redis still loading its AOF: connection refused).
      let mine = "";
      const keep = (d: Buffer) => {
        const t = d.toString();
        out += t;
        if (out.length > 100_000) out = out.slice(-50_000);
        if (!ready(mine)) mine += t;
      };
      c.stdout?.on("data", keep);
      c.stderr?.on("data", keep);
      exited = new Promise((resolve) =>
        c.on("exit", () => {
          if (child === c) child = null;
          resolve();
        }),
      );
      const deadline = Date.now() + 60_000;
      while (!ready(mine)) {
        if (child !== c) throw new Error(`${what} exited before it was ready: ${out.slice(-2000)}`);
        if (Date.now() > deadline) throw new Error(`${what} not ready after 60 s: ${out.slice(-2000)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    async stop(signal) {
      const c = child;
      if (!c) return;
      c.kill(signal);
      await exited;
    },
  };
}

export interface OwnPostgres extends OwnProcess {
  url: (db?: string) => string;
  /** Over the Unix socket: reachable from any network namespace (the cluster test's observer). */
  socketUrl: (db?: string) => string;
  /** Create a database (idempotent). */
  createDatabase: (name: string) => Promise<void>;
}

/** initdb into `dir` (trust auth) and a postmaster on `host:port`. */
export function ownPostgres(opts: { dir: string; host: string; port: number; netns?: string | null; settings?: Record<string, string> }): OwnPostgres {
  const data = join(opts.dir, "data");
  const sock = join(opts.dir, "sock");
  if (!existsSync(join(data, "PG_VERSION"))) {
    mkdirSync(data, { recursive: true });
    mkdirSync(sock, { recursive: true });
    for (const d of [opts.dir, data, sock])
      chownSync(
        d,
        Number(spawnSync("id", ["-u", "postgres"], { encoding: "utf8" }).stdout.trim()),
        Number(spawnSync("id", ["-g", "postgres"], { encoding: "utf8" }).stdout.trim()),
      );
    run(
      [
        "setpriv",
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        join(PG_BIN, "initdb"),
        "-D",
        data,
        "--auth=trust",
        "-U",
        "postgres",
        "--no-sync",
        "-E",
        "UTF8",
      ],
      "initdb",
    );
    // Its own instance on the test's private address: any host of the test's subnet may connect.
    appendFileSync(join(data, "pg_hba.conf"), "host all all 0.0.0.0/0 trust\n");
  }
  const proc = foreground(
    () => [
      ...prefix(opts.netns ?? null),
      "setpriv",
      "--reuid=postgres",
      "--regid=postgres",
      "--init-groups",
      join(PG_BIN, "postgres"),
      "-D",
      data,
      "-p",
      String(opts.port),
      "-k",
      sock,
      "-c",
      `listen_addresses=${opts.host}`,
      "-c",
      "fsync=off",
      "-c",
      "max_connections=200",
      "-c",
      "shared_buffers=32MB",
      ...Object.entries(opts.settings ?? {}).flatMap(([k, v]) => ["-c", `${k}=${v}`]),
    ],
    (out) => out.includes("ready to accept connections"),
    `postgres on ${opts.host}:${opts.port}`,
  );
  const url = (db = "postgres") => `postgres://postgres@${opts.host}:${opts.port}/${db}`;
  return {
    get running() {
      return proc.running;
    },
    log: proc.log,
    start: proc.start,
    stop: proc.stop,
    url,
    socketUrl: (db = "postgres") => `postgres://postgres@${encodeURIComponent(sock)}:${opts.port}/${db}`,
    async createDatabase(name) {
      const c = new pg.Client({ connectionString: opts.netns ? `postgres://postgres@${encodeURIComponent(sock)}:${opts.port}/postgres` : url() });
      await c.connect();
      try {
        const has = await c.query("SELECT 1 FROM pg_database WHERE datname = $1", [name]);
        if (has.rowCount === 0) await c.query(`CREATE DATABASE ${name}`);
      } finally {
        await c.end();
      }
    },
  };
}

export interface OwnRedis extends OwnProcess {
  url: string;
}

/** redis-server with AOF (appendfsync always) in `dir`, noeviction, on `host:port`. */
export function ownRedis(opts: { dir: string; host: string; port: number; netns?: string | null }): OwnRedis {
  mkdirSync(opts.dir, { recursive: true });
  const proc = foreground(
    () => [
      ...prefix(opts.netns ?? null),
      "redis-server",
      "--port",
      String(opts.port),
      "--bind",
      opts.host,
      "--dir",
      opts.dir,
      "--appendonly",
      "yes",
      "--appendfsync",
      "always",
      "--save",
      "",
      "--protected-mode",
      "no",
      "--maxmemory-policy",
      "noeviction",
    ],
    (out) => out.includes("Ready to accept connections"),
    `redis on ${opts.host}:${opts.port}`,
  );
  return {
    get running() {
      return proc.running;
    },
    log: proc.log,
    start: proc.start,
    stop: proc.stop,
    url: `redis://${opts.host}:${opts.port}`,
  };
}
