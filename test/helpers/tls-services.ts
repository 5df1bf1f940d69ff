import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { runChecked } from "./processes.ts";

/**
 * A Postgres and a Redis of the test's own, reachable only over TLS and only with passwords (a
 * certificate authority made here, scram-sha-256, a Redis ACL user), for what a managed deployment
 * looks like. Never the shared services: own data directories, own ports, removed at stop.
 */
export interface TlsServices {
  caFile: string;
  pgPort: number;
  redisPort: number;
  superPassword: string;
  redisUser: string;
  redisPassword: string;
  /** postgres://user:pw@127.0.0.1:port/db?sslmode=verify-full&sslrootcert=CA */
  pgUrl(user: string, password: string, database: string): string;
  redisUrl(): string;
  stop(): Promise<void>;
}

/** Why these services cannot run here, or null when they can. */
export function tlsServicesUnavailable(): string | null {
  if (process.getuid?.() !== 0) return "needs root (initdb runs as the postgres user)";
  if (pgBin() === null) return "no Debian PostgreSQL server binaries under /usr/lib/postgresql";
  for (const bin of ["openssl", "redis-server", "runuser"]) {
    try {
      execFileSync("sh", ["-c", `command -v ${bin}`], { stdio: "ignore" });
    } catch {
      return `${bin} is not installed`;
    }
  }
  return null;
}

function pgBin(): string | null {
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return null;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, "bin", "postgres")))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] === undefined ? null : join(root, versions[0], "bin");
}

/** A port nothing listens on now (the kernel picks it); a server started on it keeps it across restarts. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      s.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

function started(child: ChildProcess, what: string, ready: RegExp): Promise<void> {
  let out = "";
  return new Promise((resolve, reject) => {
    const on = (d: Buffer) => {
      out += d.toString();
      if (ready.test(out)) resolve();
    };
    child.stdout?.on("data", on);
    child.stderr?.on("data", on);
    child.on("exit", (code) => reject(new Error(`${what} exited (${code}) before it was ready: ${out.slice(-2000)}`)));
  });
}

export async function startTlsServices(): Promise<TlsServices> {
  const bin = pgBin();
  if (bin === null) throw new Error("no PostgreSQL binaries");
  const dir = mkdtempSync(join(tmpdir(), "rlq-tls-"));
  chmodSync(dir, 0o755);
  const run = (cmd: string, args: string[]) => runChecked(cmd, args, { cwd: dir });
  // A CA, and a server certificate for 127.0.0.1 signed by it.
  await run("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rlq-test-ca", "-keyout", "ca.key", "-out", "ca.crt"]);
  await run("openssl", ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr"]);
  writeFileSync(join(dir, "san.ext"), "subjectAltName=IP:127.0.0.1\n");
  await run("openssl", [
    "x509",
    "-req",
    "-in",
    "server.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-days",
    "2",
    "-extfile",
    "san.ext",
    "-out",
    "server.crt",
  ]);
  const superPassword = `su-${Math.random().toString(36).slice(2)}`;
  const redisUser = "rlqapp";
  const redisPassword = `rd-${Math.random().toString(36).slice(2)}`;
  // Postgres: TLS only, passwords only.
  const data = join(dir, "pg");
  mkdirSync(data, { mode: 0o700 });
  chownSync(data, uid("postgres"), gid("postgres"));
  writeFileSync(join(dir, "pw"), superPassword + "\n");
  chownSync(join(dir, "pw"), uid("postgres"), gid("postgres"));
  for (const f of ["server.key", "server.crt"]) chownSync(join(dir, f), uid("postgres"), gid("postgres"));
  chmodSync(join(dir, "server.key"), 0o600);
  await runChecked("runuser", [
    "-u",
    "postgres",
    "--",
    join(bin, "initdb"),
    "-D",
    data,
    "-U",
    "postgres",
    "--pwfile",
    join(dir, "pw"),
    "--auth",
    "scram-sha-256",
    "-E",
    "UTF8",
  ]);
  writeFileSync(join(data, "pg_hba.conf"), "hostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 0.0.0.0/0 reject\n");
  const pgPort = await freePort();
  const postgres = spawn(
    "runuser",
    [
      "-u",
      "postgres",
      "--",
      join(bin, "postgres"),
      "-D",
      data,
      "-p",
      String(pgPort),
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      `unix_socket_directories=${data}`,
      "-c",
      "ssl=on",
      "-c",
      `ssl_cert_file=${join(dir, "server.crt")}`,
      "-c",
      `ssl_key_file=${join(dir, "server.key")}`,
      "-c",
      "fsync=off",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  await started(postgres, "postgres", /ready to accept connections/);
  // Redis: the TLS port only, the default user off, one ACL user with a password.
  const redisPort = await freePort();
  const redis = spawn(
    "redis-server",
    [
      "--port",
      "0",
      "--tls-port",
      String(redisPort),
      "--bind",
      "127.0.0.1",
      "--tls-cert-file",
      join(dir, "server.crt"),
      "--tls-key-file",
      join(dir, "server.key"),
      "--tls-ca-cert-file",
      join(dir, "ca.crt"),
      "--tls-auth-clients",
      "no",
      "--save",
      "",
      "--appendonly",
      "no",
      "--dir",
      dir,
      "--user",
      "default",
      "off",
      "--user",
      redisUser,
      "on",
      `>${redisPassword}`,
      "~*",
      "&*",
      "+@all",
      "-config",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  await started(redis, "redis-server", /Ready to accept connections/);
  const caFile = join(dir, "ca.crt");
  const stop = async () => {
    for (const child of [redis, postgres]) {
      if (child.exitCode !== null) continue;
      const gone = new Promise((r) => child.on("exit", r));
      child.kill("SIGTERM");
      await gone;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  return {
    caFile,
    pgPort,
    redisPort,
    superPassword,
    redisUser,
    redisPassword,
    pgUrl: (user, password, database) =>
      `postgres://${user}:${encodeURIComponent(password)}@127.0.0.1:${pgPort}/${database}?sslmode=verify-full&sslrootcert=${encodeURIComponent(caFile)}`,
    redisUrl: () => `rediss://${redisUser}:${encodeURIComponent(redisPassword)}@127.0.0.1:${redisPort}`,
    stop,
  };
}

function uid(user: string): number {
  return Number(execFileSync("id", ["-u", user]).toString().trim());
}
function gid(user: string): number {
  return Number(execFileSync("id", ["-g", user]).toString().trim());
}

/** Run SQL as `url`'s user (the test's own server). */
export async function sqlAs(url: string, sql: string): Promise<pg.QueryResult> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await c.query(sql);
  } finally {
    await c.end();
  }
}
