package csharp

import "strings"

// mask returns source with the insides of comments, string and character literals replaced
// by blanks (line breaks kept, so offsets and lines stay the same); ok is false when a
// literal or comment does not end.
func mask(source string) (string, bool) {
	out := []byte(source)
	end, ok := maskCode(source, out, 0, false)
	return string(out), ok && end == len(source)
}

// maskCode masks from i until the end of source, or, in an interpolation hole, until the
// `}` that closes it (returning its index).
func maskCode(source string, out []byte, i int, hole bool) (int, bool) {
	depth := 0
	for i < len(source) {
		switch {
		case strings.HasPrefix(source[i:], "//"):
			end := strings.IndexByte(source[i:], '\n')
			if end < 0 {
				end = len(source) - i
			}
			blankOut(out, i, i+end)
			i += end
		case strings.HasPrefix(source[i:], "/*"):
			end := strings.Index(source[i+2:], "*/")
			if end < 0 {
				return i, false
			}
			blankOut(out, i, i+2+end+2)
			i += 2 + end + 2
		case source[i] == '"' || source[i] == '\'' || strings.HasPrefix(source[i:], "@\"") ||
			strings.HasPrefix(source[i:], "$\"") || strings.HasPrefix(source[i:], "$@\"") ||
			strings.HasPrefix(source[i:], "@$\""):
			end, ok := maskLiteral(source, out, i)
			if !ok {
				return i, false
			}
			i = end
		case hole && source[i] == '{':
			depth++
			i++
		case hole && source[i] == '}':
			if depth == 0 {
				return i, true
			}
			depth--
			i++
		default:
			i++
		}
	}
	return i, !hole
}

// maskLiteral masks the string or character literal at i and returns the index after it.
func maskLiteral(source string, out []byte, i int) (int, bool) {
	prefix := 0
	interpolated, verbatim := false, false
	for ; source[i+prefix] != '"' && source[i+prefix] != '\''; prefix++ {
		interpolated = interpolated || source[i+prefix] == '$'
		verbatim = verbatim || source[i+prefix] == '@'
	}
	quote := source[i+prefix]
	j := i + prefix + 1
	for j < len(source) {
		c := source[j]
		switch {
		case c == '\\' && !verbatim:
			blankOut(out, j, min(j+2, len(source)))
			j += 2
		case c == quote && verbatim && j+1 < len(source) && source[j+1] == quote:
			blankOut(out, j, j+2)
			j += 2
		case c == quote:
			return j + 1, true
		case interpolated && c == '{' && j+1 < len(source) && source[j+1] == '{':
			blankOut(out, j, j+2)
			j += 2
		case interpolated && c == '{':
			closing, ok := maskCode(source, out, j+1, true)
			if !ok {
				return j, false
			}
			blankOut(out, j, closing+1)
			j = closing + 1
		case c == '\n' && !verbatim:
			return j, false
		default:
			blankOut(out, j, j+1)
			j++
		}
	}
	return j, false
}

func blankOut(out []byte, from, to int) {
	for k := from; k < to; k++ {
		if out[k] != '\n' {
			out[k] = ' '
		}
	}
}
