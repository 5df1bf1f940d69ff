/**
 * `trainer: {kind: remote, ...}` (docs/trainer-protocol.md, docs/deploy.md).
 *
 * - `url`: the trainer's base URL as this worker reaches it.
 * - `api_key`: bearer token for every request to the trainer (and for its checkpoint files),
 *   `{env: NAME}` or `{file: PATH}`, read by each rlq process that talks to the trainer.
 * - `advertise_address`: host or IP the trainer fetches the batch (and the input checkpoint, with
 *   `checkpoints: fetch`) from. Default: this host's address on the route to the trainer, i.e. the
 *   address the worker itself uses to reach it. Set it behind NAT or a proxy.
 * - `checkpoints`: `shared` (the trainer writes into rlq's `output_dir` on a filesystem both see,
 *   today's default) or `fetch` (no shared filesystem: the trainer writes on its own disk and
 *   serves the files; rlq workers download them and verify their sha256).
 */

import { z } from "zod";
import { secretRefSchema } from "../config/secrets.ts";

export const remoteTrainerConfigSchema = z
  .object({
    kind: z.literal("remote"),
    url: z.string().url(),
    api_key: secretRefSchema.nullable().default(null),
    advertise_address: z
      .string()
      .regex(/^[A-Za-z0-9.:_-]+$/, "a host name or IP address (no scheme, no port), e.g. 10.0.0.5")
      .nullable()
      .default(null),
    checkpoints: z.enum(["shared", "fetch"]).default("shared"),
  })
  .strict();
