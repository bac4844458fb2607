// Bundles the scratch pad into api/sandpod_gateway/pad/, which the gateway serves at /pad/.
//   npm ci && npm run build        (hack/web/build.sh does both)
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = process.env.PAD_OUTDIR || join(here, "..", "api", "sandpod_gateway", "pad");

await rm(outdir, { recursive: true, force: true });
await mkdir(outdir, { recursive: true });
await esbuild.build({
  entryPoints: { pad: join(here, "src", "main.js") },
  bundle: true,
  splitting: true, // each language's grammar is its own chunk, loaded when picked
  format: "esm",
  minify: true,
  target: ["es2020"],
  entryNames: "[name]",
  chunkNames: "chunks/[name]-[hash]",
  outdir,
  legalComments: "linked",
  logLevel: "info",
});
await copyFile(join(here, "src", "index.html"), join(outdir, "index.html"));
