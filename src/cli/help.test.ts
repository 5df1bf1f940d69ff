import { describe, expect, it } from "vitest";
import { commandHelp, commandsIn, helpOrVersion, packageVersion, unknownSubcommand } from "./help.ts";

const usage = `rlq — test usage

  rlq migrate
  rlq run start --config FILE
  rlq run status ID [--json]
  rlq up [--run ID]
                                                controller(s) and workers in one process
  rlq config check FILE

Environment: ...`;

describe("rlq help, --help, --version and typos", () => {
  it("reads the commands off the usage text", () => {
    expect(commandsIn(usage)).toEqual(["migrate", "run", "up", "config", "help"]);
    expect(commandHelp(usage, "up")).toBe("  rlq up [--run ID]\n                                                controller(s) and workers in one process");
    expect(commandHelp(usage, "run")).toBe("  rlq run start --config FILE\n  rlq run status ID [--json]");
    expect(commandHelp(usage, "config")).toMatch(/^ {2}rlq config check FILE\n\n {2}rlq config import-slime SCRIPT.sh/);
  });

  it("--help, -h, help, help CMD, CMD --help and --version answer on stdout with exit 0", () => {
    for (const argv of [["--help"], ["-h"], ["help"]]) expect(helpOrVersion(argv, usage)).toEqual({ code: 0, stdout: usage + "\n" });
    expect(helpOrVersion(["help", "run"], usage)).toEqual({ code: 0, stdout: commandHelp(usage, "run") + "\n" });
    expect(helpOrVersion(["run", "--help"], usage)).toEqual({ code: 0, stdout: commandHelp(usage, "run") + "\n" });
    expect(helpOrVersion(["run", "start", "-h"], usage)).toEqual({ code: 0, stdout: commandHelp(usage, "run") + "\n" });
    // In this process nothing says it runs dist/bundle/ (bin/rlq.js would): the sources.
    expect(helpOrVersion(["--version"], usage)).toEqual({ code: 0, stdout: `rlq ${packageVersion()} (sources)\n` });
    const entry = Symbol.for("rlq.entry");
    (globalThis as unknown as Record<symbol, unknown>)[entry] = { bundleBuiltAt: "2026-11-23T08:00:00.000Z" };
    try {
      expect(helpOrVersion(["--version"], usage)?.stdout).toBe(`rlq ${packageVersion()} (bundle, built 2026-11-23T08:00:00.000Z)\n`);
    } finally {
      delete (globalThis as unknown as Record<symbol, unknown>)[entry];
    }
    expect(packageVersion()).toMatch(/^\d+\.\d+\.\d+/);
    // No command at all: the usage, but exit 1 (nothing was asked for).
    expect(helpOrVersion([], usage)).toEqual({ code: 1, stdout: usage + "\n" });
    // A real command goes on to run.
    expect(helpOrVersion(["run", "status", "r1"], usage)).toBeNull();
  });

  it("a typo exits 2 and names the nearest command; help for an unknown topic too", () => {
    expect(helpOrVersion(["rnu"], usage)).toMatchObject({
      code: 2,
      stderr: expect.stringMatching(/^rlq: unknown command 'rnu'; did you mean 'rlq run'\?\nCommands: migrate, run, up, config, help/),
    });
    expect(helpOrVersion(["migarte"], usage)).toMatchObject({ code: 2, stderr: expect.stringContaining("did you mean 'rlq migrate'?") });
    expect(helpOrVersion(["kubernetes"], usage)).toMatchObject({ code: 2, stderr: expect.not.stringContaining("did you mean") });
    expect(helpOrVersion(["help", "confg"], usage)).toMatchObject({ code: 2, stderr: expect.stringContaining("did you mean 'rlq config'?") });
    expect(unknownSubcommand("run", "strat", ["start", "status"])).toBe("rlq run strat: expected start, status; did you mean 'rlq run start'?");
  });
});
