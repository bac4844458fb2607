package runner

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ruffDiagnostic is the part of one entry of `ruff check --output-format=json`
// that the result carries.
type ruffDiagnostic struct {
	// Code is null for syntax errors in older ruff versions; Name is then the
	// best identifier there is.
	Code     *string `json:"code"`
	Name     string  `json:"name"`
	Message  string  `json:"message"`
	Location struct {
		Row    int `json:"row"`
		Column int `json:"column"`
	} `json:"location"`
}

// ParseRuffJSON turns ruff's JSON output into diagnostics; never nil.
func ParseRuffJSON(data []byte) ([]Diagnostic, error) {
	var entries []ruffDiagnostic
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("parsing the linter's JSON output: %w", err)
	}
	diagnostics := make([]Diagnostic, 0, len(entries))
	for _, entry := range entries {
		code := entry.Name
		if entry.Code != nil {
			code = *entry.Code
		}
		if code == "" {
			code = "syntax-error"
		}
		diagnostics = append(diagnostics, Diagnostic{
			Code:    code,
			Message: entry.Message,
			Line:    entry.Location.Row,
			Column:  entry.Location.Column,
		})
	}
	return diagnostics, nil
}

// renderDiagnostics is the human-readable form framed as lint mode's stdout.
func renderDiagnostics(sourceFile string, diagnostics []Diagnostic) string {
	var text strings.Builder
	for _, d := range diagnostics {
		fmt.Fprintf(&text, "%s:%d:%d: %s %s\n", sourceFile, d.Line, d.Column, d.Code, d.Message)
	}
	return text.String()
}
