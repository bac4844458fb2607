// The kernel of a JavaScript or TypeScript session: one node process that runs a session's
// runs one after another in ONE global scope, started by the runner's waiting shim as
// `node [flags] kernel.mjs <sourceFile>` (docs/runner-protocol.md, "Node: the kernel on fd 3").
// It says it is ready on fd 3 (the byte R) and then serves runs over it: a request is a
// 4-byte big-endian length and JSON {"run", "source", "argv", "mark"}; the answer the same
// framing around {"run", "exitCode", "value"}.
//
// The code runs through V8's REPL mode (the inspector's Runtime.evaluate with replMode, as
// Chrome's console and Deno's Jupyter kernel do): top-level let and const live on from run to
// run and may be declared again, top-level await works, and the completion value (the
// trailing expression's) comes back, shown by util.inspect as the Node REPL shows it. Static
// imports become dynamic ones (acorn finds them, as the Node REPL does), resolved from the
// work dir. TypeScript has its types stripped first by Node's own stripTypeScriptTypes.
//
// Node cannot receive descriptors, so a run's stdout and stderr are the kernel's own (pipes
// the runner reads for the kernel's life): the kernel writes the run's mark on both before
// the run and again after it, and the runner keeps what lies between.
import { Session } from 'node:inspector';
import { createRequire, stripTypeScriptTypes } from 'node:module';
import { Socket } from 'node:net';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { inspect } from 'node:util';
import vm from 'node:vm';

const workDir = process.cwd();
const sourceFile = process.argv[2] ?? 'main.js';
const typescript = /\.[cm]?ts$/.test(sourceFile);
const importKey = 'sandpod.kernel.import';
const maxValueChars = 65537;

// What the program may rebind or delete later, kept here first.
const write = Writable.prototype.write;
const { stdout, stderr } = process;
const session = new Session();
session.connect();

// acorn, loaded by the first run that has an import.
let acorn;

function parser() {
  if (acorn === undefined) {
    try {
      acorn = createRequire(import.meta.url)('acorn');
    } catch {
      // Without it static imports are left to V8, which refuses them.
      acorn = null;
    }
  }
  return acorn?.parse ?? null;
}

function post(method, params) {
  return new Promise((resolve, reject) => {
    session.post(method, params, (error, result) => (error ? reject(error) : resolve(result)));
  });
}

function writeOut(stream, text) {
  return new Promise((resolve) => {
    try {
      write.call(stream, text, () => resolve());
    } catch {
      resolve();
    }
  });
}

// An import the run's code makes (its static imports rewritten, its import() calls) is
// resolved from the work dir, as the same code in a file there would be.
const importFromWorkDir = new vm.Script('(specifier, options) => import(specifier, options)', {
  filename: join(workDir, '[sandpod kernel]'),
  importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
}).runInThisContext();
globalThis.require = createRequire(join(workDir, '[sandpod kernel]'));
Object.defineProperty(globalThis, Symbol.for(importKey), { value: importFromWorkDir });

// The inspector hands back objects by id: util.inspect is called on them through this one,
// held by its id only (no global keeps it).
globalThis.__sandpodInspect = (value) => inspect(value);
const inspectId = (await post('Runtime.evaluate', { expression: 'globalThis.__sandpodInspect' })).result.objectId;
delete globalThis.__sandpodInspect;

async function show(remote) {
  const argument =
    remote.objectId !== undefined
      ? { objectId: remote.objectId }
      : remote.unserializableValue !== undefined
        ? { unserializableValue: remote.unserializableValue }
        : { value: remote.value };
  const shown = await post('Runtime.callFunctionOn', {
    objectId: inspectId,
    functionDeclaration: 'function (value) { return this(value); }',
    arguments: [argument],
    returnByValue: true,
  });
  return shown.exceptionDetails ? remote.description ?? String(remote.value) : shown.result.value;
}

// Static imports at the top level become `const … = await import(…)`; import() anywhere goes
// through importFromWorkDir. Code acorn cannot parse is left as it is: V8 says what is wrong.
function rewriteImports(code) {
  const parse = /\bimport\b/.test(code) ? parser() : null;
  if (parse === null) {
    return code;
  }
  let tree = null;
  for (const sourceType of ['module', 'script']) {
    try {
      tree = parse(code, { ecmaVersion: 'latest', sourceType, allowAwaitOutsideFunction: true, allowHashBang: true });
      break;
    } catch {
      // the other kind, or V8's word
    }
  }
  if (tree === null) {
    return code;
  }
  const importer = `globalThis[Symbol.for(${JSON.stringify(importKey)})]`;
  const edits = [];
  for (const statement of tree.body) {
    if (statement.type === 'ImportDeclaration') {
      edits.push([statement.start, statement.end, importStatement(code, statement, importer)]);
    }
  }
  const visit = (node) => {
    if (node === null || typeof node !== 'object') {
      return;
    }
    if (Array.isArray(node)) {
      node.forEach(visit);
      return;
    }
    if (node.type === 'ImportExpression') {
      edits.push([node.start, node.start + 'import'.length, importer]);
    }
    for (const [key, child] of Object.entries(node)) {
      if (key !== 'type' && typeof child === 'object') {
        visit(child);
      }
    }
  };
  tree.body.filter((statement) => statement.type !== 'ImportDeclaration').forEach(visit);
  edits.sort((a, b) => b[0] - a[0]);
  for (const [start, end, text] of edits) {
    code = code.slice(0, start) + text + code.slice(end);
  }
  return code;
}

function importStatement(code, statement, importer) {
  const source = code.slice(statement.source.start, statement.source.end);
  const attributes = (statement.attributes ?? []).map(
    (attribute) => `${code.slice(attribute.key.start, attribute.key.end)}: ${code.slice(attribute.value.start, attribute.value.end)}`,
  );
  const call = `await ${importer}(${source}${attributes.length ? `, { with: { ${attributes.join(', ')} } }` : ''})`;
  const named = [];
  let namespace = null;
  for (const specifier of statement.specifiers) {
    const local = specifier.local.name;
    if (specifier.type === 'ImportNamespaceSpecifier') {
      namespace = local;
    } else if (specifier.type === 'ImportDefaultSpecifier') {
      named.push(`default: ${local}`);
    } else {
      const imported = code.slice(specifier.imported.start, specifier.imported.end);
      named.push(imported === local ? local : `${imported}: ${local}`);
    }
  }
  if (namespace !== null) {
    return `const ${namespace} = ${call}${named.length ? `, { ${named.join(', ')} } = ${namespace}` : ''};`;
  }
  return named.length ? `const { ${named.join(', ')} } = ${call};` : `${call};`;
}

// A run's code as V8 gets it: types stripped, imports rewritten, named cell-N in stacks.
function prepare(number, source) {
  const code = typescript ? stripTypeScriptTypes(source, { mode: 'transform' }) : source;
  return `${rewriteImports(code)}\n//# sourceURL=cell-${number}\n`;
}

// A SIGINT (the runner's cancel) ends the run that waits, as Ctrl-C in the Node REPL does;
// code that keeps the thread busy is not interrupted (the runner then kills the kernel).
let interrupt = null;
process.on('SIGINT', () => interrupt?.());
// An error nothing caught, in a callback or a promise, is printed, not fatal: the session's
// state lives on.
process.on('uncaughtException', (error) => writeOut(stderr, `Uncaught ${inspect(error)}\n`));
process.on('unhandledRejection', (reason) => writeOut(stderr, `Uncaught (in promise) ${inspect(reason)}\n`));

async function evaluate(number, source) {
  let code;
  try {
    code = prepare(number, source);
  } catch (error) {
    await writeOut(stderr, `${inspect(error)}\n`);
    return [1, null];
  }
  const interrupted = new Promise((resolve) => {
    interrupt = () => resolve({ interrupted: true });
  });
  const evaluation = post('Runtime.evaluate', { expression: code, replMode: true, awaitPromise: true, objectGroup: 'run' });
  const answer = await Promise.race([evaluation, interrupted]);
  interrupt = null;
  if (answer.interrupted) {
    await writeOut(stderr, 'Uncaught Error: Script execution was interrupted by `SIGINT`\n');
    return [1, null];
  }
  if (answer.exceptionDetails) {
    const exception = answer.exceptionDetails.exception;
    const shown = exception ? withoutKernelFrames(await show(exception)) : answer.exceptionDetails.text;
    await writeOut(stderr, `Uncaught ${shown}\n`);
    return [1, null];
  }
  const value = answer.result.type === 'undefined' ? null : (await show(answer.result)).slice(0, maxValueChars);
  return [0, value];
}

// A stack's frames below the run's code are the kernel's own (the inspector's post).
function withoutKernelFrames(text) {
  const lines = text.split('\n');
  const first = lines.findIndex((line) => /^\s+at Session\.post \(node:inspector/.test(line));
  if (first === -1) {
    return text;
  }
  let last = first;
  while (last < lines.length && /^\s+at /.test(lines[last])) {
    last++;
  }
  lines.splice(first, last - first);
  return lines.join('\n');
}

function exitStatus(status) {
  const code = process.exitCode;
  process.exitCode = undefined;
  if (status !== 0 || code === undefined || code === null) {
    return status;
  }
  const number = Number(code);
  return Number.isInteger(number) ? number & 0xff : 1;
}

async function serve(request) {
  const { run, source, argv, mark } = request;
  await Promise.all([writeOut(stdout, mark), writeOut(stderr, mark)]);
  process.argv = [process.execPath, ...argv.map((arg, index) => (index === 0 ? join(workDir, arg) : arg))];
  const [status, value] = await evaluate(run, source);
  await post('Runtime.releaseObjectGroup', { objectGroup: 'run' });
  // The marks follow everything the run wrote through the streams.
  await Promise.all([writeOut(stdout, mark), writeOut(stderr, mark)]);
  return { run, exitCode: exitStatus(status), value };
}

const channel = new Socket({ fd: 3, readable: true, writable: true });
let buffered = Buffer.alloc(0);
let serving = Promise.resolve();
channel.on('data', (chunk) => {
  buffered = Buffer.concat([buffered, chunk]);
  while (buffered.length >= 4 && buffered.length >= 4 + buffered.readUInt32BE(0)) {
    const size = buffered.readUInt32BE(0);
    const request = JSON.parse(buffered.subarray(4, 4 + size).toString('utf8'));
    buffered = buffered.subarray(4 + size);
    serving = serving.then(async () => {
      const reply = Buffer.from(JSON.stringify(await serve(request)));
      const header = Buffer.alloc(4);
      header.writeUInt32BE(reply.length);
      channel.write(Buffer.concat([header, reply]));
    });
  }
});
// The runner is gone: so is the session.
channel.on('end', () => process.exit(0));
channel.on('error', () => process.exit(0));
channel.write('R');
