// The gateway's answers in plain words.

const REASONS = {
  NonZeroExit: "the program exited with an error",
  Signaled: "the program was killed by a signal",
  OOMKilled: "the program ran out of memory",
  DeadlineExceeded: "the program ran past its timeout",
  Cancelled: "you cancelled it",
  SessionEnded: "the session had ended",
  SessionNotFound: "the session does not exist",
};

function seconds(ms) {
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

/** One sentence for a finished (or not yet finished) execution result. */
export function describeResult(result, timeoutSeconds) {
  const took = result.execution_time_ms == null ? "" : ` after ${seconds(result.execution_time_ms)}`;
  const reason = REASONS[result.reason];
  switch (result.status) {
    case "pending":
      return "Waiting for a sandbox…";
    case "running":
      return "Running…";
    case "success":
      return `Finished: exit code 0${took}.`;
    case "error": {
      const how = result.signal
        ? `killed by signal ${result.signal}`
        : `exit code ${result.exit_code ?? "unknown"}`;
      return `Failed: ${how}${took}${reason ? ` (${reason})` : ""}.`;
    }
    case "timeout":
      return `Timed out: stopped after ${timeoutSeconds ?? "its"} seconds, the run's timeout. Raise the timeout under "Input and limits" or make the program faster.`;
    case "cancelled":
      return `Cancelled${took}.`;
    case "sandbox_error":
      return `The sandbox failed: ${result.error_message || result.reason || "unknown cause"}${
        result.retryable ? " (trying again may help)" : ""
      }.`;
    default:
      return `Status: ${result.status}.`;
  }
}

/** What was cut from the output, or "". */
export function describeTruncation(result) {
  const cut = [];
  if (result.stdout_truncated) cut.push("stdout");
  if (result.stderr_truncated) cut.push("stderr");
  if (!cut.length) return "";
  return ` The output was too long: ${cut.join(" and ")} shows only the end the sandbox kept.`;
}

/** A message for an ApiError. */
export function describeError(error) {
  const wait = error.retryAfter ? ` Try again in ${error.retryAfter} s.` : " Try again shortly.";
  if (error.status === 0) return error.message;
  if (error.status === 401)
    return "This API key is not accepted: it is wrong, or it was revoked. Enter a valid key.";
  if (error.code === "concurrency_limit")
    return `Too many runs at once: this tenant's earlier runs have not finished yet.${wait}`;
  if (error.status === 429) return `Too many requests at once for this tenant.${wait}`;
  if (error.status === 503) return `The gateway cannot serve this right now.${wait}`;
  const detail = (error.details || []).map((d) => d.message).join("; ");
  return detail ? `${error.message}: ${detail}` : error.message;
}

/** Bytes in a Kubernetes quantity ("512Mi", "1Gi", "1G", "100000"), or null. */
export function quantityBytes(text) {
  const match = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(text ?? "").trim());
  if (!match) return null;
  const units = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(match[1]) * (units[match[2]] ?? 1);
}

/** "m:ss" for a number of seconds. */
export function clock(totalSeconds) {
  const s = Math.max(0, Math.round(totalSeconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}
