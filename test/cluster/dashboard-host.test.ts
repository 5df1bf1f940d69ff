import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";
import { waitFor, repoRoot } from "../helpers/processes.ts";
import { admin, createTestDatabase } from "../helpers/services.ts";
import { createCluster, netnsAvailable, type Cluster, type HostProc } from "./netns.ts";

/**
 * The dashboard and /metrics bound beyond loopback (http-access/access.ts): `rlq dashboard --host
 * <address>` runs in one network namespace ("dash"), and requests come from another ("client"),
 * as from another machine. Without the token a page, a JSON API, /queues and /metrics (the
 * dashboard's and the RLQ_METRICS_PORT server's) answer 401; with `Authorization: Bearer` they are
 * served, and a browser's `/?token=` sets an HttpOnly, SameSite=Strict cookie that serves the rest.
 * Started beyond loopback without a token, rlq refuses with a message that names what to set.
 * The dashboard reaches the test's Postgres through its Unix socket (a socket path is not bound to
 * a network namespace) and uses BullMQ's Postgres backend, so no server moves into a namespace.
 */
const TOKEN = "dash-host-test-token-0123456789";
const skip = netnsAvailable();
if (skip) console.warn(`test/cluster/dashboard-host.test.ts SKIPPED: ${skip}`);

describe.skipIf(skip !== null)("dashboard bound beyond loopback needs the token", () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let cluster: Cluster;
  let home: string;
  let env: Record<string, string>;
  let dash: HostProc;
  let base: string;
  let metricsBase: string;

  const rlq = (args: string[]) => ["node", ...rlqNodeFlags, "bin/rlq.js", ...args];

  /** curl from the client namespace: status, then headers. */
  function request(url: string, headers: string[] = []): { status: number; headers: string } {
    const out = cluster.exec("client", ["curl", "-s", "-D", "-", "-o", "/dev/null", "--max-time", "20", ...headers.flatMap((h) => ["-H", h]), url]);
    const status = Number(/^HTTP\/\S+ (\d+)/.exec(out)?.[1] ?? 0);
    return { status, headers: out };
  }

  beforeAll(async () => {
    database = await createTestDatabase("rlq_dashhost");
    const socketDir = (await admin((c) => c.query<{ d: string }>("SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS d"))).rows[0]?.d;
    if (!socketDir) throw new Error("the test Postgres has no unix_socket_directories: this test reaches it from a network namespace through its socket");
    const url = new URL(database.url);
    url.searchParams.set("host", socketDir.trim());
    home = mkdtempSync(join(tmpdir(), "rlq-dashhost-"));
    writeFileSync(join(home, "token"), `${TOKEN}\n`);
    env = {
      DATABASE_URL: url.toString(),
      REDIS_URL: "",
      RLQ_QUEUE_PREFIX: `tdashhost${Date.now().toString(36)}`,
      RLQ_HOME: home,
      RLQ_LOG_LEVEL: "info",
      RLQ_METRICS_PORT: "0",
    };
    cluster = createCluster(["dash", "client"]);
    const ip = cluster.host("dash").ip;
    dash = cluster.spawn("dash", rlq(["dashboard", "--host", ip, "--port", "0"]), { ...env, RLQ_DASHBOARD_TOKEN_FILE: join(home, "token") }, repoRoot);
    base = await waitFor(
      "dashboard url",
      () => /dashboard listening (http:\/\/\S+)/.exec(dash.output())?.[1] ?? (dash.child.exitCode !== null ? `exited: ${dash.output()}` : null),
      120_000,
    );
    expect(base).toBe(`http://${ip}:${/:(\d+)$/.exec(base)?.[1]}`);
    metricsBase = `http://${ip}:${/metrics listening (\d+)/.exec(dash.output())?.[1]}`;
  });
  afterAll(async () => {
    dash?.kill("SIGKILL");
    await dash?.exited;
    cluster?.destroy();
    await database?.drop();
    if (home) rmSync(home, { recursive: true, force: true });
  });

  const guarded = () => [`${base}/`, `${base}/api/runs`, `${base}/queues`, `${base}/queues/api/queues`, `${base}/metrics`, `${metricsBase}/metrics`];

  it("refuses a page, a JSON API, /queues and /metrics without the token, from another namespace", () => {
    for (const u of guarded()) {
      const r = request(u);
      expect({ u, status: r.status }).toEqual({ u, status: 401 });
      expect(r.headers).toMatch(/^www-authenticate: Bearer/im);
      expect({ u, status: request(u, ["authorization: Bearer wrong-token-0123456789abc"]).status }).toEqual({ u, status: 401 });
    }
    expect(request(`${base}/?token=wrong-token-0123456789abc`).status).toBe(401);
    expect(request(`${base}/healthz`).status).toBe(200);
  });

  it("serves them with Authorization: Bearer, and a browser through ?token= and its cookie", () => {
    for (const u of guarded()) expect({ u, status: request(u, [`authorization: Bearer ${TOKEN}`]).status }).toEqual({ u, status: 200 });

    const first = request(`${base}/?token=${TOKEN}&run=r1`);
    expect(first.status).toBe(303);
    expect(first.headers).toMatch(/^location: \/\?run=r1\r?$/im);
    const setCookie = /^set-cookie: (.*)$/im.exec(first.headers)?.[1] ?? "";
    expect(setCookie).toMatch(/HttpOnly/);
    expect(setCookie).toMatch(/SameSite=Strict/);
    const cookie = setCookie.split(";")[0] as string;
    for (const u of guarded().slice(0, 5)) expect({ u, status: request(u, [`cookie: ${cookie}`]).status }).toEqual({ u, status: 200 });
    expect(dash.output()).not.toContain(TOKEN);
  });

  it("refuses to start beyond loopback without a token, naming the flag, the env and what to set", async () => {
    const ip = cluster.host("dash").ip;
    const p = cluster.spawn("dash", rlq(["dashboard", "--port", "0"]), { ...env, RLQ_DASHBOARD_HOST: ip }, repoRoot);
    expect(await p.exited).toBe(2);
    expect(p.output()).toContain(`would listen on ${ip} (--host / RLQ_DASHBOARD_HOST), beyond loopback`);
    expect(p.output()).toMatch(/set RLQ_DASHBOARD_TOKEN .*or RLQ_DASHBOARD_TOKEN_FILE/);
    expect(p.output()).not.toMatch(/dashboard listening|metrics listening/);
  });
});
