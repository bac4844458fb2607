package runner

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTerminationMessageKeepsASmallResultWhole(t *testing.T) {
	summary := summaryRecord{
		Result: Result{ExitCode: intPtr(1), Diagnostics: []Diagnostic{{Code: "F401", Message: "unused", Line: 1, Column: 8}}},
		Frames: 1,
		Key:    strings.Repeat("ab", frameKeyBytes),
	}
	var decoded summaryRecord
	if err := json.Unmarshal(TerminationMessage(summary), &decoded); err != nil {
		t.Fatal(err)
	}
	assertSameJSON(t, "summary", summary, decoded)
}

func TestTerminationMessageDropsDiagnosticsBeyond4KiB(t *testing.T) {
	result := Result{ExitCode: intPtr(1), StdoutBytes: 12345}
	for range 100 {
		result.Diagnostics = append(result.Diagnostics, Diagnostic{Code: "E501", Message: "Line too long (120 > 88)", Line: 1, Column: 89})
	}
	summary := summaryRecord{Result: result, Frames: 7, Key: strings.Repeat("ab", frameKeyBytes)}
	message := TerminationMessage(summary)

	if len(message) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes", len(message))
	}
	var decoded summaryRecord
	if err := json.Unmarshal(message, &decoded); err != nil {
		t.Fatal(err)
	}
	summary.Result.Diagnostics = nil
	assertSameJSON(t, "summary", summary, decoded)
}

func TestTerminationMessageShortensAHugeError(t *testing.T) {
	huge := strings.Repeat("é\"<", 3000)
	message := TerminationMessage(summaryRecord{Result: Result{Error: &huge}, Key: strings.Repeat("ab", frameKeyBytes)})

	if len(message) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes", len(message))
	}
	var summary summaryRecord
	if err := json.Unmarshal(message, &summary); err != nil {
		t.Fatal(err)
	}
	decoded := summary.Result
	if decoded.Error == nil || !strings.HasSuffix(*decoded.Error, "…") || !utf8.ValidString(*decoded.Error) ||
		!strings.HasPrefix(huge, strings.TrimSuffix(*decoded.Error, "…")) || len(*decoded.Error) < 1000 {
		t.Errorf("error shortened to %d bytes", len(*decoded.Error))
	}
}
