// Types of toolgate_bridge.mjs, the bridge client for Node 18+.

/** A content block of a result, as data. */
export type Part =
  | { type: "text"; text: string; trust: string }
  | { type: "artifact"; artifact_id: string; media_type: string; bytes: number; trust: string };

/** An artifact a call produced. */
export interface ArtifactInfo {
  artifact_id: string;
  media_type: string;
  bytes: number;
  trust: string;
}

/** The six-field outcome of a call that did not succeed. */
export interface Outcome {
  status: "denied" | "failed" | "unavailable" | "uncertain";
  action: string;
  reason_code: string;
  message: string;
  retryable: boolean;
  remediation: string;
}

export declare const IDLE_REUSE_MS: number;
export declare const UNSETTLED: readonly string[];
export declare function callId(scriptSha256: string, ordinal: number): string;

export declare class BridgeError extends Error {
  readonly status: number;
  readonly code: string | undefined;
}
export declare class ToolError extends Error {
  readonly outcome: Outcome;
  readonly content: Part[];
  readonly reasonCode: string;
  readonly retryable: boolean;
  /** No settled outcome yet: calling it again in the same turn is the same call. */
  readonly unsettled: boolean;
}
export declare class Denied extends ToolError {}
export declare class Failed extends ToolError {}
export declare class Unavailable extends ToolError {}
export declare class Uncertain extends ToolError {}
/** The user has not granted the tool's server their account: nothing ran. */
export declare class ConsentRequired extends Unavailable {
  readonly serverId: string;
  readonly url: string;
}

export declare class Result {
  readonly action: string;
  readonly content: Part[];
  readonly structured: unknown;
  readonly artifacts: ArtifactInfo[];
  readonly text: string;
  value(): unknown;
}

export interface PinnedTool {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  output_schema: Record<string, unknown> | null;
}

export declare class Bridge {
  constructor(options?: { socketPath?: string; token?: string; timeoutMs?: number });
  close(): void;
  call(name: string, args?: Record<string, unknown>): Promise<unknown>;
  callResult(name: string, args?: Record<string, unknown>): Promise<Result>;
  artifact(artifactId: string): Promise<Uint8Array>;
  tools(): Promise<PinnedTool[]>;
}

export declare function call(name: string, args?: Record<string, unknown>): Promise<unknown>;
export declare function callResult(name: string, args?: Record<string, unknown>): Promise<Result>;
export declare function artifact(artifactId: string): Promise<Uint8Array>;
export declare function tools(): Promise<PinnedTool[]>;
export declare function close(): void;
export declare function text(value: string | Result | Part[]): string;
export declare function generateDeclarations(pinned: PinnedTool[]): string;
export declare function generateModule(pinned: PinnedTool[]): string;
