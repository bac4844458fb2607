// Package csharp lets Mono's compiler (mcs, C# up to 7.2) build a program written with
// top-level statements (C# 9, every .NET template's default): the statements are wrapped in
// a Main method, `using` directives stay on top, type declarations follow the wrapper, and
// #line directives keep every line and column the user's in the compiler's messages. mcs
// has no local functions, so a top-level function becomes a static method beside Main (it
// cannot use the statements' variables, as a local function could).
package csharp

import (
	"fmt"
	"regexp"
	"strings"
)

// chunk is one top-level piece of a source file: a using directive, a type declaration, or a
// statement (local functions included), as its text and where it starts.
type chunk struct {
	kind   chunkKind
	text   string // the original text, comments and strings included
	masked string // the same with comments and literals blanked: what the patterns read
	line   int    // 1-based
	indent string // what precedes it on its line, as blanks (tabs kept): columns stay the user's
}

type chunkKind int

const (
	statementChunk chunkKind = iota
	usingChunk
	typeChunk
	functionChunk
	directiveChunk
)

// implicitUsings are the namespaces a .NET console project imports by itself
// (ImplicitUsings, on in every template): a top-level program may use them unnamed.
var implicitUsings = []string{
	"System", "System.Collections.Generic", "System.IO", "System.Linq", "System.Net.Http",
	"System.Threading", "System.Threading.Tasks",
}

var (
	plainUsing      = regexp.MustCompile(`^\s*using\s+([\w.]+)\s*;`)
	usingDirective  = regexp.MustCompile(`^\s*(global\s+)?using\s+((static\s+)?[\w.:]+|\w+\s*=\s*[^;]+)\s*;\s*$`)
	typeDeclaration = regexp.MustCompile(`^\s*(\[[^\]]*\]\s*)*((public|internal|private|protected|static|sealed|abstract|partial|unsafe|readonly|ref|new|file)\s+)*(class|struct|interface|enum|record|delegate|namespace)\b`)
	mainMethod      = regexp.MustCompile(`\bstatic\b[^;{}=]*\bMain\s*\(`)
	// A local function: [modifiers] Type Name[<T>](...
	localFunction = regexp.MustCompile(`^\s*((static|async|unsafe|extern)\s+)*[A-Za-z_][\w.]*(<[^;{}()=]*>)?(\[\s*\])*\??\s+([A-Za-z_]\w*)\s*(<[^;{}()=]*>)?\s*\(`)
	// Words that start a statement with the shape `word Name(`, not a local function.
	statementWords = map[string]bool{
		"return": true, "await": true, "throw": true, "yield": true, "new": true, "else": true,
		"case": true, "goto": true, "using": true, "lock": true, "var": true, "do": true,
	}
	staticModifier = regexp.MustCompile(`^\s*((async|unsafe|extern)\s+)*static\b`)
	awaitWord      = regexp.MustCompile(`\bawait\b`)
	valueReturn    = regexp.MustCompile(`\breturn\s*[^;\s]`)
)

// Wrap returns the source mcs should compile in place of source, written as fileName, and
// whether it differs: a file with statements at its top level and no static Main method is
// wrapped; anything else (a classic program, or text this package cannot split) comes back
// unchanged for the compiler to judge.
func Wrap(source, fileName string) (string, bool) {
	source = strings.TrimPrefix(source, "\uFEFF")
	chunks, ok := split(source)
	if !ok {
		return source, false
	}
	statements := 0
	for _, c := range chunks {
		if c.kind == typeChunk && mainMethod.MatchString(c.masked) {
			return source, false
		}
		if c.kind == statementChunk && strings.TrimSpace(c.masked) != ";" {
			statements++
		}
	}
	if statements == 0 {
		return source, false
	}
	return render(chunks, fileName), true
}

func render(chunks []chunk, fileName string) string {
	var out strings.Builder
	emit := func(c chunk) {
		fmt.Fprintf(&out, "#line %d %q\n%s%s\n", c.line, fileName, c.indent, c.text)
	}
	written := map[string]bool{}
	for _, c := range chunks {
		if c.kind == usingChunk {
			emit(c)
			if match := plainUsing.FindStringSubmatch(c.masked); match != nil {
				written[match[1]] = true
			}
		}
	}
	out.WriteString("#line default\n")
	for _, namespace := range implicitUsings {
		if !written[namespace] {
			fmt.Fprintf(&out, "using %s;\n", namespace)
		}
	}
	async, returnsValue := false, false
	for _, c := range chunks {
		if c.kind != statementChunk {
			continue
		}
		async = async || awaitWord.MatchString(c.masked)
		returnsValue = returnsValue || valueReturn.MatchString(c.masked)
	}
	out.WriteString("partial class Program {\n")
	for _, c := range chunks {
		if c.kind == functionChunk {
			if !staticModifier.MatchString(c.masked) {
				out.WriteString("static\n")
			}
			emit(c)
		}
	}
	body := "static void Main(string[] args) {\n"
	switch {
	case async && returnsValue:
		out.WriteString("static int Main(string[] args) { return SandpodTopLevel(args).GetAwaiter().GetResult(); }\n")
		body = "static async System.Threading.Tasks.Task<int> SandpodTopLevel(string[] args) {\n"
	case async:
		out.WriteString("static void Main(string[] args) { SandpodTopLevel(args).GetAwaiter().GetResult(); }\n")
		body = "static async System.Threading.Tasks.Task SandpodTopLevel(string[] args) {\n"
	case returnsValue:
		body = "static int Main(string[] args) {\n"
	}
	out.WriteString(body)
	for _, c := range chunks {
		if c.kind == statementChunk || c.kind == directiveChunk {
			emit(c)
		}
	}
	// A program that returns on every path makes this line unreachable (warning CS0162).
	if returnsValue {
		out.WriteString("#line default\n#pragma warning disable 162\nreturn 0;\n#pragma warning restore 162\n")
	} else {
		out.WriteString("#line default\n")
	}
	out.WriteString("}\n}\n")
	for _, c := range chunks {
		if c.kind == typeChunk {
			emit(c)
		}
	}
	return out.String()
}

func isLocalFunction(masked string) bool {
	match := localFunction.FindStringSubmatch(masked)
	if match == nil {
		return false
	}
	first := strings.Fields(masked)[0]
	return !statementWords[first]
}

// split cuts source into its top-level chunks; ok is false when its brackets or literals do
// not balance (the compiler will say why).
func split(source string) ([]chunk, bool) {
	masked, ok := mask(source)
	if !ok {
		return nil, false
	}
	var chunks []chunk
	start := -1
	depth := 0 // (), [] and {} together: a chunk ends only at depth 0
	braces := 0
	closeChunk := func(end int) {
		c := newChunk(source, masked, start, end)
		chunks = append(chunks, c)
		start = -1
	}
	for i := 0; i < len(masked); i++ {
		ch := masked[i]
		if start < 0 {
			if ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' {
				continue
			}
			if ch == '#' {
				end := strings.IndexByte(masked[i:], '\n')
				if end < 0 {
					end = len(masked) - i
				}
				start = i
				c := newChunk(source, masked, start, i+end)
				c.kind = directiveChunk
				chunks = append(chunks, c)
				start = -1
				i += end
				continue
			}
			start = i
		}
		switch ch {
		case '(', '[', '{':
			depth++
			if ch == '{' {
				braces++
			}
		case ')', ']', '}':
			depth--
			if depth < 0 {
				return nil, false
			}
			if ch == '}' {
				braces--
				if depth == 0 && !continuesAfterBrace(masked[i+1:]) {
					closeChunk(i + 1)
				}
			}
		case ';':
			if depth == 0 {
				closeChunk(i + 1)
			}
		}
	}
	if depth != 0 || braces != 0 {
		return nil, false
	}
	if start >= 0 {
		// Text after the last `;` or `}`: a statement missing its end, for mcs to report.
		closeChunk(len(masked))
	}
	return chunks, true
}

// continuesAfterBrace says whether the text after a top-level `}` still belongs to the same
// statement: `} = ...`, `};`, `}.Method()`, `})`, `} else`, `} while`, `} catch`, `} finally`.
var continuation = regexp.MustCompile(`^\s*([;=.,)\]?:]|else\b|while\b|catch\b|finally\b)`)

func continuesAfterBrace(rest string) bool {
	return continuation.MatchString(rest)
}

func newChunk(source, masked string, start, end int) chunk {
	lineStart := strings.LastIndexByte(source[:start], '\n') + 1
	c := chunk{
		text:   source[start:end],
		masked: masked[start:end],
		line:   strings.Count(source[:start], "\n") + 1,
		indent: strings.Map(blank, source[lineStart:start]),
	}
	switch {
	case usingDirective.MatchString(c.masked):
		c.kind = usingChunk
	case typeDeclaration.MatchString(c.masked):
		c.kind = typeChunk
	case isLocalFunction(c.masked):
		c.kind = functionChunk
	default:
		c.kind = statementChunk
	}
	return c
}

func blank(r rune) rune {
	if r == '\t' {
		return r
	}
	return ' '
}
