import { chmodSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { freePort } from "../../src/lib/port-holder.ts";
import { ensureEmbeddedPostgres, probeEmbeddedPort, type EmbeddedPostgresHandle } from "../../src/store/embedded-postgres.ts";
import { letPostgresUserIn, repoRoot } from "../helpers/processes.ts";

/**
 * An embedded Postgres belongs to its RLQ_HOME (store/embedded-postgres.ts). Two homes given the
 * same configured port each get their own server: the second finds the port serving the first
 * home's data directory, starts its own on another port and records it in its pg.json, and a
 * later command in either home adopts that home's server, not the other's. A port held by
 * something that is not Postgres is named by pid in the note. Homes are 0755 directories: as root
 * the server runs as the postgres user, which must enter them.
 */
async function dataDirectory(url: string): Promise<string> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query<{ data_directory: string }>("SHOW data_directory")).rows[0]?.data_directory ?? "";
  } finally {
    await c.end();
  }
}

const portOf = (url: string) => Number(new URL(url).port);

describe("an embedded Postgres belongs to its RLQ_HOME", () => {
  letPostgresUserIn(repoRoot);
  const root = mkdtempSync(join(tmpdir(), "rlq-pg-home-"));
  chmodSync(root, 0o755);
  const handles: EmbeddedPostgresHandle[] = [];
  let squatter: Server | null = null;
  const squatterSockets: Socket[] = [];
  afterAll(async () => {
    for (const h of handles.reverse()) await h.close();
    for (const s of squatterSockets) s.destroy();
    await new Promise<void>((r) => (squatter ? squatter.close(() => r()) : r()));
    rmSync(root, { recursive: true, force: true });
  });

  it("a second home on the same port starts its own server, records its port, and each home adopts only its own", async () => {
    const port = await freePort();
    const homeA = join(root, "a", ".rlq");
    const homeB = join(root, "b", ".rlq");
    const a = await ensureEmbeddedPostgres(homeA, port);
    handles.push(a);
    expect(a.isOwner).toBe(true);
    expect(portOf(a.url)).toBe(port);
    expect(await dataDirectory(a.url)).toBe(join(homeA, "pg"));

    // Before: B adopted A's server (same credentials). Now B sees A's data directory and starts its own.
    expect(await probeEmbeddedPort(port, join(homeB, "pg"))).toEqual({ kind: "other_home", dataDirectory: join(homeA, "pg") });
    const b = await ensureEmbeddedPostgres(homeB, port);
    handles.push(b);
    expect(b.isOwner).toBe(true);
    expect(portOf(b.url)).not.toBe(port);
    expect(await dataDirectory(b.url)).toBe(join(homeB, "pg"));
    expect(b.note).toContain(`port ${port} serves the embedded Postgres of ${join(homeA, "pg")}`);
    expect(JSON.parse(readFileSync(join(homeB, "pg.json"), "utf8"))).toMatchObject({ port: portOf(b.url), dataDirectory: join(homeB, "pg") });

    // Later commands in each home find that home's server.
    const b2 = await ensureEmbeddedPostgres(homeB, port);
    expect(b2).toMatchObject({ isOwner: false, url: b.url });
    const a2 = await ensureEmbeddedPostgres(homeA, port);
    expect(a2).toMatchObject({ isOwner: false, url: a.url });

    // B's server stopped: the next command in B starts it again on its recorded port, as the
    // configured one still serves A.
    await b.close();
    handles.splice(handles.indexOf(b), 1);
    expect(await probeEmbeddedPort(portOf(b.url), join(homeB, "pg"))).toEqual({ kind: "free" });
    const b3 = await ensureEmbeddedPostgres(homeB, port);
    handles.push(b3);
    expect(b3).toMatchObject({ isOwner: true, url: b.url });
  });

  it("a port held by something else is named by its process, and the home's server starts on another port", async () => {
    squatter = createServer((socket) => {
      squatterSockets.push(socket);
      socket.end("not postgres\n");
    });
    await new Promise<void>((r) => squatter?.listen(0, "127.0.0.1", () => r()));
    const address = squatter.address();
    const port = typeof address === "object" && address !== null ? address.port : 0;
    const home = join(root, "c", ".rlq");
    const c = await ensureEmbeddedPostgres(home, port);
    handles.push(c);
    expect(c.isOwner).toBe(true);
    expect(portOf(c.url)).not.toBe(port);
    expect(await dataDirectory(c.url)).toBe(join(home, "pg"));
    expect(c.note).toContain(`port ${port} is held by pid ${process.pid}`);
  });
});
