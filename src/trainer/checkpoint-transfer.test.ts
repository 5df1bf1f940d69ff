import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { advertisedAddress, bearerMatches, downloadCheckpointFile, ensureLocalWeights, trainerFilePath } from "./checkpoint-transfer.ts";
import { RlqError } from "../lib/errors.ts";

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

describe("checkpoint transfer", () => {
  const body = Buffer.from("weights of version 3");
  let server: Server;
  let url: string;
  let dir: string;
  const seen: string[] = [];
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "rlq-ckpt-transfer-"));
    // A stand-in for server.py's GET /v1/checkpoint-files/... (workers/trainer-torch/transfer.py: serve_file).
    server = createServer((q, res) => {
      seen.push(q.url ?? "");
      if (q.headers.authorization !== "Bearer tok") {
        res.writeHead(401).end('{"error":{"code":"unauthorized"}}');
        return;
      }
      res.writeHead(200, { "content-type": "application/octet-stream" }).end(body);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("bearerMatches compares the whole header", () => {
    expect(bearerMatches("Bearer abc", "abc")).toBe(true);
    expect(bearerMatches("Bearer abd", "abc")).toBe(false);
    expect(bearerMatches(undefined, "abc")).toBe(false);
    expect(bearerMatches("abc", "abc")).toBe(false);
  });

  it("advertises the source address on the route to the trainer, or the configured one", async () => {
    expect(await advertisedAddress("http://127.0.0.1:8700", null)).toEqual({ host: "127.0.0.1", listen: "127.0.0.1" });
    expect(await advertisedAddress("http://127.0.0.1:8700", "10.0.0.5")).toEqual({ host: "10.0.0.5", listen: "0.0.0.0" });
  });

  it("names a checkpoint by its last three path components", () => {
    expect(trainerFilePath("/home/x/.rlq/checkpoints/run1/step-3/attempt-0-ab", "weights.safetensors")).toBe(
      "/v1/checkpoint-files/run1/step-3/attempt-0-ab/weights.safetensors",
    );
  });

  it("keeps a download only when its sha256 matches, and sends the token", async () => {
    const d = join(dir, "run1", "step-0", "attempt-0-aa");
    await downloadCheckpointFile(url, "tok", d, "weights.safetensors", sha(body));
    expect(readFileSync(join(d, "weights.safetensors")).equals(body)).toBe(true);
    expect(seen.at(-1)).toBe("/v1/checkpoint-files/run1/step-0/attempt-0-aa/weights.safetensors");

    const bad = join(dir, "run1", "step-1", "attempt-0-bb");
    const err = await downloadCheckpointFile(url, "tok", bad, "weights.safetensors", "0".repeat(64)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RlqError);
    expect((err as RlqError).code).toBe("checkpoint_hash_mismatch");
    expect(readdirSync(bad)).toEqual([]); // neither the file nor its temporary
  });

  it("a wrong token is not retried", async () => {
    const err = await downloadCheckpointFile(url, "nope", join(dir, "r", "step-0", "a"), "weights.safetensors", sha(body)).catch((e: unknown) => e);
    expect((err as RlqError).code).toBe("checkpoint_fetch_failed");
    expect((err as RlqError).isRetriable).toBe(false);
  });

  it("ensureLocalWeights keeps a matching file, fetches a missing one, refuses a wrong one without a source", async () => {
    const d = join(dir, "run2", "step-0", "attempt-1-cc");
    await ensureLocalWeights(d, sha(body), { url, token: "tok" });
    expect(existsSync(join(d, "weights.safetensors"))).toBe(true);
    const n = seen.length;
    await ensureLocalWeights(d, sha(body), { url, token: "tok" });
    expect(seen.length).toBe(n); // already here, verified, not fetched again
    const e = await ensureLocalWeights(d, "1".repeat(64), null).catch((x: unknown) => x);
    expect((e as RlqError).code).toBe("checkpoint_hash_mismatch");
    const missing = await ensureLocalWeights(join(dir, "nowhere"), sha(body), null).catch((x: unknown) => x);
    expect((missing as RlqError).code).toBe("version_unavailable");
  });
});
