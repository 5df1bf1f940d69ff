/**
 * @file A file or directory that does not exist, as a named case: `readdir(dir).catch(ifMissing([]))`
 * answers the fallback for ENOENT only and passes every other error on (a permission, a full disk,
 * a bad path), so a catch that means "not there yet" never swallows anything else.
 */

/** A `.catch` handler: `fallback` when the error is ENOENT, else the error again. */
export function ifMissing<T>(fallback: T): (e: unknown) => T {
  return (e: unknown) => {
    if ((e as NodeJS.ErrnoException | null)?.code === "ENOENT") return fallback;
    throw e;
  };
}
