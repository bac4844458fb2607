package runner

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestExitStatus(t *testing.T) {
	message := "no interpreter"
	cases := map[string]struct {
		result Result
		want   int
	}{
		"exit code":      {Result{ExitCode: intPtr(3)}, 3},
		"success":        {Result{ExitCode: intPtr(0)}, 0},
		"signal":         {Result{Signal: intPtr(11)}, 139},
		"timeout":        {Result{Signal: intPtr(9), TimedOut: true}, ExitCodeTimedOut},
		"runner failure": {Result{Error: &message}, ExitCodeRunnerFailed},
	}
	for name, tc := range cases {
		if got := tc.result.ExitStatus(); got != tc.want {
			t.Errorf("%s: %d, want %d", name, got, tc.want)
		}
	}
}

func TestTerminationMessageKeepsASmallResultWhole(t *testing.T) {
	result := Result{ExitCode: intPtr(1), Diagnostics: []Diagnostic{{Code: "F401", Message: "unused", Line: 1, Column: 8}}}
	var decoded Result
	if err := json.Unmarshal(TerminationMessage(result), &decoded); err != nil {
		t.Fatal(err)
	}
	assertSameJSON(t, "result", result, decoded)
}

func TestTerminationMessageDropsDiagnosticsBeyond4KiB(t *testing.T) {
	result := Result{ExitCode: intPtr(1), StdoutBytes: 12345}
	for range 100 {
		result.Diagnostics = append(result.Diagnostics, Diagnostic{Code: "E501", Message: "Line too long (120 > 88)", Line: 1, Column: 89})
	}
	message := TerminationMessage(result)

	if len(message) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes", len(message))
	}
	var decoded Result
	if err := json.Unmarshal(message, &decoded); err != nil {
		t.Fatal(err)
	}
	result.Diagnostics = nil
	assertSameJSON(t, "result", result, decoded)
}

func TestTerminationMessageShortensAHugeError(t *testing.T) {
	huge := strings.Repeat("é\"<", 3000)
	message := TerminationMessage(Result{Error: &huge})

	if len(message) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes", len(message))
	}
	var decoded Result
	if err := json.Unmarshal(message, &decoded); err != nil {
		t.Fatal(err)
	}
	if decoded.Error == nil || !strings.HasSuffix(*decoded.Error, "…") || !utf8.ValidString(*decoded.Error) ||
		!strings.HasPrefix(huge, strings.TrimSuffix(*decoded.Error, "…")) || len(*decoded.Error) < 1000 {
		t.Errorf("error shortened to %d bytes", len(*decoded.Error))
	}
}
