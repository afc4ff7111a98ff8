// Streams one completion: node dist/examples/stream.js [host:port] [prompt] [maxTokens]
// Ctrl-C aborts the stream; the server then cancels this task.
import { HyserveClient } from "../src/index.js";

const [target = "localhost:50051", prompt = "Once upon a time", maxTokens = "32"] = process.argv.slice(2);
const client = new HyserveClient(target);
const controller = new AbortController();
process.once("SIGINT", () => controller.abort());

for await (const event of client.generate(
  { input: { case: "text", value: { text: prompt } }, stopping: { maxTokens: Number(maxTokens) } },
  { signal: controller.signal, sessionId: "example-session" },
)) {
  if (event.event.case === "delta") {
    process.stdout.write(event.event.value.text);
  } else if (event.event.case === "finished") {
    console.error(`\n[${event.event.value.usage?.completionTokens} tokens]`);
  }
}
