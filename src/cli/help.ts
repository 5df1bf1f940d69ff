/**
 * `rlq --help`, `rlq help CMD`, `rlq CMD --help`, `rlq --version`, and the
 * nearest command for a typo. The command list is read off the usage text
 * (each `  rlq CMD ...` line), so a command added to the usage is known here.
 */

import { readFileSync } from "node:fs";
import { nearest } from "../lib/nearest.ts";

/** More words for a command than its usage line has room for. */
const details: Record<string, string> = {
  config: `  rlq config import-slime SCRIPT.sh [-o run.yaml]   a slime launch script (bash arrays, continuation
                                                    lines, sourced model files) to an rlq run config
  rlq config import-slime --flag value ... [-o run.yaml]   the same from train.py's flags
      The YAML goes to stdout (or -o FILE); the report (what changes the run first, mapped,
      renamed, placement, dropped by group with why, written by rlq, validation) goes to stderr.
      Exit 2 unless the result validates and nothing that changes what the run does was dropped.
  rlq config check FILE [--set key=value]... [--json]
      Validate, print the effective config (every default filled in), and warn of keys that
      change nothing with this config and of slime defaults that rlq does not share.`,
};

export function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string };
  return pkg.version;
}

/**
 * What this process runs: `bundle, built <time>` when bin/rlq.js started dist/bundle/ (it matched
 * the sources), else `sources` (tsx, or dist/ compiled by tsc). bin/rlq.js says which.
 */
export function runningFrom(): string {
  const entry = (globalThis as unknown as Record<symbol, unknown>)[Symbol.for("rlq.entry")] as { bundleBuiltAt?: string } | undefined;
  return entry?.bundleBuiltAt ? `bundle, built ${entry.bundleBuiltAt}` : "sources";
}

/** The commands named in `usage` (`  rlq run start ...` → run). */
export function commandsIn(usage: string): string[] {
  const names = [...usage.matchAll(/^\s+rlq ([a-z][a-z-]*)/gm)].map((m) => m[1] as string);
  return [...new Set([...names, "help"])];
}

/** The usage lines of one command (its lines and their indented continuations), with its details. */
export function commandHelp(usage: string, cmd: string): string | null {
  const lines = usage.split("\n");
  const out: string[] = [];
  let inCmd = false;
  for (const line of lines) {
    const m = /^\s+rlq ([a-z][a-z-]*)/.exec(line);
    if (m) inCmd = m[1] === cmd;
    else if (!/^\s{8,}\S/.test(line)) inCmd = false;
    if (inCmd) out.push(line);
  }
  const extra = details[cmd];
  if (out.length === 0 && extra === undefined) return null;
  return [...out, ...(extra === undefined ? [] : ["", extra])].join("\n");
}

export interface EarlyAnswer {
  code: number;
  stdout?: string;
  stderr?: string;
}

/**
 * Answers help, version and unknown commands before any service starts;
 * null: go on and run the command.
 */
export function helpOrVersion(argv: readonly string[], usage: string): EarlyAnswer | null {
  const [cmd, ...rest] = argv;
  if (cmd === undefined) return { code: 1, stdout: usage + "\n" };
  if (cmd === "--version" || cmd === "-v" || cmd === "version") return { code: 0, stdout: `rlq ${packageVersion()} (${runningFrom()})\n` };
  const commands = commandsIn(usage);
  if (cmd === "--help" || cmd === "-h" || cmd === "help") {
    const topic = cmd === "help" ? rest.find((a) => !a.startsWith("-")) : undefined;
    if (topic === undefined) return { code: 0, stdout: usage + "\n" };
    const text = commandHelp(usage, topic);
    if (text !== null) return { code: 0, stdout: text + "\n" };
    return { code: 2, stderr: unknownCommand(topic, commands) };
  }
  if (!commands.includes(cmd)) return { code: 2, stderr: unknownCommand(cmd, commands) };
  if (rest.includes("--help") || rest.includes("-h")) return { code: 0, stdout: (commandHelp(usage, cmd) ?? usage) + "\n" };
  return null;
}

function unknownCommand(cmd: string, commands: readonly string[]): string {
  const near = nearest(cmd, commands);
  return `rlq: unknown command '${cmd}'${near === null ? "" : `; did you mean 'rlq ${near}'?`}\nCommands: ${commands.join(", ")}. rlq --help lists them with their options.\n`;
}

/** The error for an unknown subcommand (`rlq run strat`), with the nearest one. */
export function unknownSubcommand(cmd: string, sub: string | undefined, subs: readonly string[]): string {
  const near = sub === undefined ? null : nearest(sub, subs);
  return `rlq ${cmd} ${sub ?? ""}: expected ${subs.join(", ")}${near === null ? "" : `; did you mean 'rlq ${cmd} ${near}'?`}`;
}
