export declare const NEEDED: { major: number; minor: number };
export declare function nodeVersionProblem(version: string, execPath: string, repoRoot?: string): string | null;
