// Lint mode for TypeScript: type-checks the given files with tsc (--noEmit, strict, Node's
// types) and prints its findings as the JSON list the runner reads in lint mode (ruff's
// shape: code, message, location.row and location.column, 1-based).
// Exit status: 0 clean, 1 findings, 2 when tsc could not run or said what it was not
// expected to say (its output then goes to stderr as it was).
import { spawnSync } from "node:child_process";

const tools = new URL("./node_modules/", import.meta.url).pathname;
const tsc = `${tools}@typescript/typescript-linux-x64/lib/tsc`;
// How Node runs the program: an ES module or CommonJS by what the file says (`preserve`:
// top-level await and require both pass), `.ts` imports written out, no emit.
const options = [
  "--noEmit",
  "--pretty", "false",
  "--strict",
  "--target", "esnext",
  "--module", "preserve",
  "--allowImportingTsExtensions",
  "--skipLibCheck",
  "--typeRoots", `${tools}@types`,
  "--types", "node",
];
// tsc's plain form: `file(line,col): error TS1234: message`, continued on indented lines;
// an error with no place (a bad option) is `error TS1234: message`.
const located = /^(.*)\((\d+),(\d+)\): (?:error|warning|message) (TS\d+): (.*)$/;
const unlocated = /^(?:error|warning|message) (TS\d+): (.*)$/;

const files = process.argv.slice(2);
const checked = spawnSync(tsc, [...options, ...files], { encoding: "utf8", maxBuffer: 64 << 20 });
if (checked.error || checked.status === null || checked.status > 2) {
  process.stderr.write(checked.stderr ?? "");
  process.stderr.write(checked.error ? `tsc: ${checked.error.message}\n` : `tsc exited ${checked.status ?? checked.signal}\n`);
  process.exit(2);
}

const diagnostics = [];
for (const line of checked.stdout.split("\n")) {
  let match;
  if ((match = located.exec(line))) {
    const [, , row, column, code, message] = match;
    diagnostics.push({ code, message, location: { row: Number(row), column: Number(column) } });
  } else if ((match = unlocated.exec(line))) {
    const [, code, message] = match;
    diagnostics.push({ code, message, location: { row: 1, column: 1 } });
  } else if (/^\s+\S/.test(line) && diagnostics.length > 0) {
    diagnostics.at(-1).message += `\n${line.trim()}`;
  } else if (line.trim() !== "") {
    process.stderr.write(`unexpected tsc output: ${checked.stdout}`);
    process.exit(2);
  }
}
process.stdout.write(JSON.stringify(diagnostics));
process.exit(diagnostics.length > 0 ? 1 : 0);
