/**
 * Moving a train step's inputs and outputs between hosts that share no
 * filesystem (docs/trainer-protocol.md, "Checkpoints without a shared
 * filesystem"; docs/deploy.md).
 *
 * - The worker serves the batch and, with `checkpoints: fetch`, its local
 *   input checkpoint, on an address the trainer can reach, behind a random
 *   per-attempt bearer token.
 * - The trainer serves the checkpoints it wrote at
 *   `GET /v1/checkpoint-files/RUN/step-S/attempt-X/NAME` behind its API key.
 *   Workers (the train job, and every embedded engine on any host) download
 *   them into the same path under their own checkpoint root and verify the
 *   sha256 before anything reads them: content-addressed by the hash the
 *   commit stored, not by the host that wrote them.
 */

import { createHash, timingSafeEqual } from "node:crypto";
import { createSocket } from "node:dgram";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { RlqError } from "../lib/errors.ts";
import { sha256File } from "../lib/hash.ts";
import { ifMissing } from "../lib/if-missing.ts";

/** The files of an rlq checkpoint directory that travel. */
export const CHECKPOINT_FILES = ["weights.safetensors", "optimizer.safetensors"] as const;

/** Constant-time check of an `authorization` header against `Bearer <token>`. */
export function bearerMatches(header: string | undefined, token: string): boolean {
  const want = Buffer.from(`Bearer ${token}`);
  const got = Buffer.from(header ?? "");
  return got.length === want.length && timingSafeEqual(got, want);
}

export function bearerHeader(token: string | null | undefined): Record<string, string> {
  return token ? { authorization: `Bearer ${token}` } : {};
}

/**
 * The address the trainer should use to reach this process: the configured
 * one, else this host's source address on the route to the trainer (a UDP
 * "connect" sends nothing; it only asks the kernel which local address it
 * would use). That is the address the worker itself reaches the trainer
 * from, so the trainer can reach it back unless NAT is in between (then set
 * `advertise_address`).
 */
export async function advertisedAddress(trainerUrl: string, configured: string | null | undefined): Promise<{ host: string; listen: string }> {
  if (configured) return { host: configured, listen: "0.0.0.0" };
  const u = new URL(trainerUrl);
  const host = u.hostname.replace(/^\[|\]$/g, "");
  const port = Number(u.port || (u.protocol === "https:" ? 443 : 80));
  const family = host.includes(":") ? "udp6" : "udp4";
  const local = await new Promise<string>((resolve, reject) => {
    const s = createSocket(family);
    s.once("error", (e) => {
      s.close();
      reject(e);
    });
    s.connect(port, host, () => {
      try {
        resolve(s.address().address);
      } catch (e) {
        reject(e instanceof Error ? e : new Error(String(e)));
      } finally {
        s.close();
      }
    });
  }).catch((e: unknown) => {
    throw new RlqError(
      "trainer_unreachable",
      `trainer ${trainerUrl}: no route from this host (${(e as Error).message}); set trainer.advertise_address if the trainer reaches this host by another address`,
      { cause: e, isRetriable: true },
    );
  });
  return { host: local.includes(":") ? `[${local}]` : local, listen: local };
}

/** name → sha256 of the checkpoint files present in `dir` (the worker's input checkpoint). */
export async function localCheckpointFiles(dir: string): Promise<Record<string, string>> {
  const present = new Set(await readdir(dir).catch(ifMissing([] as string[])));
  const out: Record<string, string> = {};
  for (const name of CHECKPOINT_FILES) if (present.has(name)) out[name] = await sha256File(join(dir, name));
  return out;
}

/** The trainer's path for a checkpoint directory rlq knows as `.../RUN/step-S/attempt-X`. */
export function trainerFilePath(checkpointDir: string, name: string): string {
  const attempt = basename(checkpointDir);
  const step = basename(dirname(checkpointDir));
  const run = basename(dirname(dirname(checkpointDir)));
  return `/v1/checkpoint-files/${encodeURIComponent(run)}/${encodeURIComponent(step)}/${encodeURIComponent(attempt)}/${encodeURIComponent(name)}`;
}

/**
 * Download one file from the trainer into `dir/name`, verifying its sha256:
 * written to a temporary name and renamed only once the hash matches, so a
 * reader never sees a partial or wrong file.
 */
export async function downloadCheckpointFile(
  trainerUrl: string,
  token: string | null,
  dir: string,
  name: string,
  sha256: string,
  timeoutMs = 600_000,
): Promise<void> {
  const url = `${trainerUrl.replace(/\/$/, "")}${trainerFilePath(dir, name)}`;
  let res: Response;
  try {
    res = await fetch(url, { headers: bearerHeader(token), signal: AbortSignal.timeout(timeoutMs) });
  } catch (e) {
    throw new RlqError("checkpoint_fetch_failed", `GET ${url}: ${(e as Error).message}`, { cause: e, isRetriable: true });
  }
  if (!res.ok || !res.body) {
    const text = await res.text().catch((e: unknown) => `(no body: ${(e as Error).message})`);
    throw new RlqError("checkpoint_fetch_failed", `GET ${url}: HTTP ${res.status} ${text.slice(0, 200)}`, {
      isRetriable: res.status !== 401 && res.status !== 403,
    });
  }
  await mkdir(dir, { recursive: true });
  const tmp = join(dir, `.${name}.${process.pid}.${Date.now()}.part`);
  const h = createHash("sha256");
  const fh = await open(tmp, "w");
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      h.update(chunk);
      await fh.write(chunk);
    }
  } catch (e) {
    await fh.close();
    await rm(tmp, { force: true });
    throw new RlqError("checkpoint_fetch_failed", `GET ${url}: ${(e as Error).message}`, { cause: e, isRetriable: true });
  }
  await fh.close();
  const got = h.digest("hex");
  if (got !== sha256) {
    await rm(tmp, { force: true });
    throw new RlqError("checkpoint_hash_mismatch", `GET ${url}: sha256 ${got}, expected ${sha256}; the file was not kept`, { isRetriable: true });
  }
  await rename(tmp, join(dir, name));
}

/**
 * Make `dir/weights.safetensors` present and equal to `sha256` (the hash the
 * commit stored): kept as is when it already is (a shared mount, or an
 * earlier download), else downloaded from the trainer.
 */
export async function ensureLocalWeights(dir: string, sha256: string, from: { url: string; token: string | null } | null): Promise<void> {
  const path = join(dir, "weights.safetensors");
  const exists = await stat(path).then(
    () => true,
    () => false,
  );
  if (exists) {
    const got = await sha256File(path);
    if (got === sha256) return;
    if (!from) throw new RlqError("checkpoint_hash_mismatch", `${path}: sha256 ${got}, the committed checkpoint has ${sha256}`, { isRetriable: false });
  } else if (!from) {
    throw new RlqError(
      "version_unavailable",
      `${path} does not exist on this host; with no shared filesystem set trainer.checkpoints: fetch (docs/deploy.md)`,
      { isRetriable: true },
    );
  }
  if (from) await downloadCheckpointFile(from.url, from.token, dir, "weights.safetensors", sha256);
}
