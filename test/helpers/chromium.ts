import { existsSync } from "node:fs";
import { runChecked } from "./processes.ts";

/**
 * Debian's chromium for the browser tests, driven by playwright-core. When it
 * is missing, setup installs it (`apt-get install -y chromium`, as root);
 * when that cannot be done the caller skips its browser test with `reason`.
 */
export const chromiumArgs = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

export async function ensureChromium(): Promise<{ path: string; reason: null } | { path: null; reason: string }> {
  const candidates = [process.env.RLQ_TEST_CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser"].filter((p): p is string => !!p);
  const found = candidates.find((p) => existsSync(p));
  if (found) return { path: found, reason: null };
  if (process.getuid?.() !== 0) return { path: null, reason: "chromium is not installed and installing it needs root (apt-get install -y chromium)" };
  try {
    await runChecked("apt-get", ["install", "-y", "--no-install-recommends", "chromium"], {
      timeoutMs: 300_000,
      env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    });
  } catch {
    try {
      await runChecked("apt-get", ["update"], { timeoutMs: 300_000 });
      await runChecked("apt-get", ["install", "-y", "--no-install-recommends", "chromium"], {
        timeoutMs: 300_000,
        env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
      });
    } catch (e) {
      return { path: null, reason: `chromium is not installed and apt-get install -y chromium failed: ${(e as Error).message.split("\n")[0]}` };
    }
  }
  return existsSync("/usr/bin/chromium")
    ? { path: "/usr/bin/chromium", reason: null }
    : { path: null, reason: "apt-get installed chromium but /usr/bin/chromium is missing" };
}
