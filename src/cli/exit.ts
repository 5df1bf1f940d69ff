/**
 * Exit once what the process wrote to stdout and stderr has reached them.
 *
 * Node writes to a pipe synchronously only while the pipe has room (64 KiB on Linux); the rest is
 * queued in the process and written as the reader drains it. `process.exit` drops that queue: under
 * load, `rlq export ID > pipe` printed 76 of a run's 96 samples (cli.test.ts, a loaded suite). An
 * empty write's callback runs after every write queued before it, so waiting for it on both
 * streams is waiting for the output to be handed over.
 */
export async function exitAfterFlush(code: number): Promise<never> {
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  process.exit(code);
}

function flushed(s: NodeJS.WriteStream): Promise<void> {
  if (s.destroyed || s.writableLength === 0) return Promise.resolve();
  // The callback also runs with an error (the reader went away: EPIPE): nothing more can be written then.
  return new Promise((resolve) => s.write("", () => resolve()));
}
