// Live tests against a running `hyserve serve`; tests/test_typescript_client.py starts the server,
// computes the Python client's greedy reference and runs `npm test` with HYSERVE_TARGET,
// HYSERVE_PROMPT, HYSERVE_MAX_TOKENS, HYSERVE_EXPECT_TEXT and HYSERVE_EXPECT_IDS (comma-separated).
// Without HYSERVE_TARGET these tests are skipped.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  CancelStatus,
  Code,
  FinishReason,
  HyserveClient,
  HyserveError,
  type GenerateRequestInit,
} from "../src/index.js";

const target = process.env.HYSERVE_TARGET ?? "";
const skip = target === "" ? "HYSERVE_TARGET not set (tests/test_typescript_client.py runs these)" : false;
const prompt = process.env.HYSERVE_PROMPT ?? "";
const maxTokens = Number(process.env.HYSERVE_MAX_TOKENS ?? "0");
const expectText = process.env.HYSERVE_EXPECT_TEXT ?? "";
const expectIds = (process.env.HYSERVE_EXPECT_IDS ?? "").split(",").filter(Boolean).map(Number);
/** The aborted stream's task id: tests/test_typescript_client.py finds it cancelled (client_gone) in the log. */
const ABORTED_TASK_ID = "ts-abort-task";

const reference: GenerateRequestInit = {
  input: { case: "text", value: { text: prompt } },
  stopping: { maxTokens },
};

function longRequest(taskId: string): GenerateRequestInit {
  return {
    taskId,
    input: { case: "text", value: { text: "Count slowly: one, two, three," } },
    stopping: { maxTokens: 400, ignoreEos: true },
  };
}

async function collect(client: HyserveClient, request: GenerateRequestInit, signal?: AbortSignal) {
  let text = "";
  const ids: number[] = [];
  for await (const event of client.generate(request, { signal, sessionId: "ts-live-test" })) {
    if (event.event.case === "delta") {
      text += event.event.value.text;
      ids.push(...event.event.value.tokenIds);
    } else if (event.event.case === "finished") {
      return { text, ids, finished: event.event.value };
    }
  }
  throw new Error("no Finished event");
}

test("model info and cache stats", { skip }, async () => {
  const client = new HyserveClient(target);
  const info = await client.modelInfo();
  assert.ok(info.vocabSize > 0 && info.parallelSlots >= 2);
  const stats = await client.cacheStats();
  assert.equal(stats.slots.length, info.parallelSlots);
});

test("streamed generation equals the Python client's", { skip }, async () => {
  const { text, ids, finished } = await collect(new HyserveClient(target), reference);
  assert.equal(text, expectText);
  assert.deepEqual(ids, expectIds);
  assert.equal(finished.usage?.completionTokens, ids.length);
});

test("Cancel of a running task", { skip }, async () => {
  const client = new HyserveClient(target);
  const taskId = `ts-cancel-${Date.now().toString(36)}`;
  let finished;
  let cancelled = false;
  for await (const event of client.generate(longRequest(taskId))) {
    if (event.event.case === "delta" && !cancelled) {
      assert.equal(await client.cancel(taskId), CancelStatus.CANCELLED);
      cancelled = true;
    } else if (event.event.case === "finished") {
      finished = event.event.value;
    }
  }
  assert.equal(finished?.reason, FinishReason.CANCELLED);
  assert.ok((finished?.usage?.completionTokens ?? 400) < 400);
  assert.equal(await client.cancel(taskId), CancelStatus.ALREADY_FINISHED);
});

test("Cancel before its Generate is PENDING and the task ends CANCELLED", { skip }, async () => {
  const client = new HyserveClient(target);
  const taskId = `ts-early-${Date.now().toString(36)}`;
  assert.equal(await client.cancel(taskId), CancelStatus.PENDING);
  const { ids, finished } = await collect(client, longRequest(taskId));
  assert.equal(finished.reason, FinishReason.CANCELLED);
  assert.deepEqual(ids, []);
  assert.equal(await client.cancel(taskId), CancelStatus.ALREADY_FINISHED);
});

test("Cancel of an id no task can have is NOT_FOUND", { skip }, async () => {
  // a space is not allowed in a task id: no Generate could ever use this one
  await assert.rejects(new HyserveClient(target).cancel("ts no such task"), (error: unknown) => {
    assert.ok(error instanceof HyserveError);
    assert.equal(error.code, Code.NotFound);
    assert.equal(error.codeName, "NOT_FOUND");
    return true;
  });
});

test("INVALID_ARGUMENT is a typed error", { skip }, async () => {
  const bad: GenerateRequestInit = { ...reference, sampling: { temperature: -1 } };
  await assert.rejects(collect(new HyserveClient(target), bad), (error: unknown) => {
    assert.ok(error instanceof HyserveError);
    assert.equal(error.code, Code.InvalidArgument);
    assert.match(error.details, /temperature/);
    assert.equal(error.retryable, false);
    return true;
  });
});

test("an aborted stream leaves the other streams running", { skip }, async () => {
  const client = new HyserveClient(target);
  const survivor = collect(client, reference);
  const controller = new AbortController();
  await assert.rejects(
    (async () => {
      for await (const event of client.generate(longRequest(ABORTED_TASK_ID), { signal: controller.signal })) {
        if (event.event.case === "delta") {
          controller.abort(); // the client goes away mid-stream
        }
      }
    })(),
    (error: unknown) => error instanceof HyserveError && error.code === Code.Canceled,
  );
  const { text, ids } = await survivor;
  assert.equal(text, expectText);
  assert.deepEqual(ids, expectIds);
  // the aborted task leaves its slot (CacheStats does not touch it, unlike a Cancel)
  for (;;) {
    const stats = await client.cacheStats();
    if (!stats.slots.some((s) => s.taskId === ABORTED_TASK_ID)) {
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});
