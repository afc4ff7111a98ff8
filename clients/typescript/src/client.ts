// A thin typed client for hyserve.v1 over plain gRPC (HTTP/2), built on the code protoc-gen-es
// generates into ./gen and on Connect's gRPC transport for Node.
//
// Streams are async iterables; an AbortSignal cancels the call, and the server then cancels that
// task and only that one (so does leaving a `for await` loop early). Every failure is thrown as
// HyserveError carrying the gRPC status code.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  CacheStatsRequestSchema,
  CancelRequestSchema,
  GenerateRequestSchema,
  HyserveService,
  ModelInfoRequestSchema,
  type CacheStatsResponse,
  type CancelStatus,
  type Finished,
  type GenerateResponse,
  type ModelInfoResponse,
  type ToolCall,
} from "./gen/hyserve/v1/hyserve_pb.js";

/** Metadata key a balancer may hash on to keep a conversation on one replica (and its cache). */
export const SESSION_HEADER = "x-session-id";

export type GenerateRequestInit = MessageInitShape<typeof GenerateRequestSchema>;

/** A task's whole answer (see HyserveClient.generateText). */
export interface Answer {
  text: string;
  reasoning: string;
  /** Complete calls, arguments in JSON text (JSON.parse(call.argumentsJson)). */
  toolCalls: ToolCall[];
  finished: Finished;
}

export interface CallOptions {
  /** Aborting it cancels the call (and, for Generate, the task on the server). */
  signal?: AbortSignal;
  /** Sent as the x-session-id header. */
  sessionId?: string;
  /** Deadline of the whole call, a Generate stream included. */
  timeoutMs?: number;
}

/** A failed call: the gRPC status code (numeric, as Connect's Code) and the server's message. */
export class HyserveError extends Error {
  readonly code: Code;
  readonly details: string;

  constructor(code: Code, details: string) {
    super(`hyserve: ${grpcCodeName(code)}: ${details}`);
    this.name = "HyserveError";
    this.code = code;
    this.details = details;
  }

  /** The gRPC name of the code, e.g. "NOT_FOUND". */
  get codeName(): string {
    return grpcCodeName(this.code);
  }

  /** Whether the same request may succeed later (queue full, server loading or draining). */
  get retryable(): boolean {
    return this.code === Code.ResourceExhausted || this.code === Code.Unavailable;
  }

  static from(error: unknown): HyserveError {
    if (error instanceof HyserveError) {
      return error;
    }
    const ce = ConnectError.from(error);
    return new HyserveError(ce.code, ce.rawMessage);
  }
}

/** "NotFound" -> "NOT_FOUND". */
export function grpcCodeName(code: Code): string {
  return (Code[code] ?? "UNKNOWN").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

function callOptions(options: CallOptions = {}) {
  return {
    signal: options.signal,
    timeoutMs: options.timeoutMs,
    headers: options.sessionId ? { [SESSION_HEADER]: options.sessionId } : undefined,
  };
}

export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>` on every call (servers run with --auth-token-file). */
  token?: string;
  /** PEM CA that verifies the server's certificate (TLS; implies https). Default: Node's roots. */
  ca?: string | Buffer;
}

function bearer(token: string): Interceptor {
  return (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
}

export class HyserveClient {
  /** The generated Connect client, for what this wrapper does not cover. */
  readonly raw: Client<typeof HyserveService>;

  /** target: "host:port" or "http://host:port" (plaintext gRPC), "https://host:port" (TLS). */
  constructor(target: string, options: ClientOptions = {}) {
    const scheme = options.ca !== undefined ? "https" : "http";
    const baseUrl = target.includes("://") ? target : `${scheme}://${target}`;
    const interceptors = options.token ? [bearer(options.token)] : [];
    const nodeOptions = options.ca !== undefined ? { ca: options.ca } : undefined;
    this.raw = createClient(HyserveService, createGrpcTransport({ baseUrl, interceptors, nodeOptions }));
  }

  /** Runs one task and yields its events: one Accepted, Deltas, one Finished. */
  async *generate(request: GenerateRequestInit, options?: CallOptions): AsyncGenerator<GenerateResponse> {
    try {
      for await (const event of this.raw.generate(create(GenerateRequestSchema, request), callOptions(options))) {
        yield event;
      }
    } catch (error) {
      throw HyserveError.from(error);
    }
  }

  /**
   * Runs a task to the end; returns its completion text (the answer's content, for chat with
   * parseOutput), its reasoning, its tool calls (Finished.toolCalls) and its Finished event.
   */
  async generateText(request: GenerateRequestInit, options?: CallOptions): Promise<Answer> {
    let text = "";
    let reasoning = "";
    for await (const event of this.generate(request, options)) {
      if (event.event.case === "delta") {
        text += event.event.value.text;
        reasoning += event.event.value.reasoning;
      } else if (event.event.case === "finished") {
        const finished = event.event.value;
        return { text, reasoning, toolCalls: finished.toolCalls, finished };
      }
    }
    throw new HyserveError(Code.Internal, "the stream ended without a Finished event");
  }

  /**
   * Stops a queued or running task by id. CancelStatus.PENDING: no task has this id yet; the server
   * cancels it if one registers within 10 s. HyserveError NOT_FOUND for an id no task can have
   * (malformed, or unknown while the server drains).
   */
  async cancel(taskId: string, options?: CallOptions): Promise<CancelStatus> {
    try {
      const response = await this.raw.cancel(create(CancelRequestSchema, { taskId }), callOptions(options));
      return response.status;
    } catch (error) {
      throw HyserveError.from(error);
    }
  }

  async cacheStats(options?: CallOptions): Promise<CacheStatsResponse> {
    try {
      return await this.raw.cacheStats(create(CacheStatsRequestSchema, {}), callOptions(options));
    } catch (error) {
      throw HyserveError.from(error);
    }
  }

  async modelInfo(options?: CallOptions): Promise<ModelInfoResponse> {
    try {
      return await this.raw.modelInfo(create(ModelInfoRequestSchema, {}), callOptions(options));
    } catch (error) {
      throw HyserveError.from(error);
    }
  }
}
