// The gateway's HTTP API, with the key in the Authorization header (never in a URL).

export class ApiError extends Error {
  constructor(status, code, message, { retryAfter = null, details = [] } = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
    this.details = details;
  }
}

async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  let details = [];
  try {
    const body = await response.json();
    ({ code, message } = body.error);
    details = body.error.details || [];
  } catch {
    // not one of the gateway's JSON errors: keep the HTTP status
  }
  const retryAfter = Number(response.headers.get("Retry-After")) || null;
  return new ApiError(response.status, code, message, { retryAfter, details });
}

export class Api {
  constructor(getKey) {
    this.getKey = getKey;
  }

  async fetch(path, { method = "GET", body, signal, accept = "application/json" } = {}) {
    const headers = { Authorization: `Bearer ${this.getKey()}`, Accept: accept };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: "no-store",
      });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, "unreachable", "The gateway cannot be reached.");
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  /** The JSON answer and its Location header. */
  async send(method, path, body) {
    const response = await this.fetch(path, { method, body });
    return { body: await response.json(), location: response.headers.get("Location") };
  }

  async get(path) {
    return (await this.send("GET", path)).body;
  }

  async blob(path) {
    return (await this.fetch(path, { accept: "*/*" })).blob();
  }

  /** Server-Sent Events through fetch (EventSource cannot send the key): {event, data}. */
  async *events(path, signal) {
    const response = await this.fetch(path, { signal, accept: "text/event-stream" });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new EventStreamParser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      yield* parser.push(value);
    }
  }
}

/** Splits a text/event-stream into events; comments (": ping") are dropped. */
export class EventStreamParser {
  constructor() {
    this.buffer = "";
    this.event = "message";
    this.data = [];
  }

  *push(text) {
    this.buffer += text;
    const lines = this.buffer.split("\n");
    this.buffer = lines.pop();
    for (const line of lines.map((l) => l.replace(/\r$/, ""))) {
      if (line === "") {
        if (this.data.length) yield { event: this.event, data: this.data.join("\n") };
        this.event = "message";
        this.data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") this.event = value;
        else if (field === "data") this.data.push(value);
      }
    }
  }
}
