/**
 * Sleeps `ms`, or less if one of `signals` fires (or already has). Resolves
 * true when a signal ended it, false when the time ran out; never rejects.
 */
export function sleep(ms: number, ...signals: Array<AbortSignal | undefined>): Promise<boolean> {
  const live = signals.filter((x): x is AbortSignal => x !== undefined);
  if (live.some((x) => x.aborted)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (stopped: boolean) => {
      clearTimeout(timer);
      for (const x of live) x.removeEventListener("abort", onStop);
      resolve(stopped);
    };
    const onStop = () => done(true);
    const timer = setTimeout(() => done(false), ms);
    for (const x of live) x.addEventListener("abort", onStop, { once: true });
  });
}
