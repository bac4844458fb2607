// Highlighting and an example program for each language of the catalog. Grammars are loaded
// when a language is picked (each is its own chunk of the bundle).
import { StreamLanguage } from "@codemirror/language";

const GRAMMARS = {
  python: async () => (await import("@codemirror/lang-python")).python(),
  javascript: async () => (await import("@codemirror/lang-javascript")).javascript(),
  typescript: async () =>
    (await import("@codemirror/lang-javascript")).javascript({ typescript: true }),
  bash: async () => StreamLanguage.define((await import("@codemirror/legacy-modes/mode/shell")).shell),
  go: async () => (await import("@codemirror/lang-go")).go(),
  csharp: async () =>
    StreamLanguage.define((await import("@codemirror/legacy-modes/mode/clike")).csharp),
};
GRAMMARS.sh = GRAMMARS.bash;
GRAMMARS.node = GRAMMARS.javascript;

/** The editor extension that highlights `name`, or [] for a language the pad does not know. */
export async function grammarFor(name) {
  const load = GRAMMARS[name];
  return load ? load() : [];
}

const EXAMPLES = {
  python: `import sys
import time

# Output appears while the program runs: stdout and stderr separately.
for step in range(1, 4):
    print(f"step {step}", flush=True)
    time.sleep(0.5)
print("a warning goes to stderr", file=sys.stderr)

name = sys.stdin.readline().strip()  # "Input and limits" below: standard input
print(f"hello, {name or 'world'}")
`,
  javascript: `// Output appears while the program runs.
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

for (let step = 1; step <= 3; step++) {
  console.log(\`step \${step}\`);
  await sleep(500);
}
console.error("a warning goes to stderr");
`,
  typescript: `interface Point {
  x: number;
  y: number;
}

function distance(a: Point, b: Point): number {
  return Math.hypot(a.x - b.x, a.y - b.y);
}

console.log(distance({ x: 0, y: 0 }, { x: 3, y: 4 }));
`,
  bash: `#!/bin/bash
for step in 1 2 3; do
  echo "step $step"
  sleep 0.5
done
echo "a warning goes to stderr" >&2
uname -a
`,
  go: `package main

import "fmt"

func main() {
	squares := make([]int, 0, 5)
	for i := 1; i <= 5; i++ {
		squares = append(squares, i*i)
	}
	fmt.Println("squares:", squares)
}
`,
  csharp: `using System;
using System.Linq;

class Program
{
    static void Main()
    {
        var squares = Enumerable.Range(1, 5).Select(i => i * i);
        Console.WriteLine("squares: " + string.Join(", ", squares));
    }
}
`,
};
EXAMPLES.sh = EXAMPLES.bash;
EXAMPLES.node = EXAMPLES.javascript;

export function exampleFor(name) {
  return EXAMPLES[name] ?? `# write your ${name} program here\n`;
}
