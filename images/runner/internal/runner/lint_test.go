package runner

import "testing"

func TestParseRuffJSON(t *testing.T) {
	report := `[
  {"cell": null, "code": "F401", "end_location": {"column": 10, "row": 1},
   "filename": "/tmp/work/main.py", "fix": null, "location": {"column": 8, "row": 1},
   "message": "` + "`os`" + ` imported but unused", "name": "unused-import", "noqa_row": 1, "url": null},
  {"code": "invalid-syntax", "name": "invalid-syntax", "location": {"column": 7, "row": 3},
   "message": "Expected an expression"},
  {"code": null, "location": {"column": 1, "row": 4}, "message": "SyntaxError: old ruff"}
]`
	diagnostics, err := ParseRuffJSON([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	want := []Diagnostic{
		{Code: "F401", Message: "`os` imported but unused", Line: 1, Column: 8},
		{Code: "invalid-syntax", Message: "Expected an expression", Line: 3, Column: 7},
		{Code: "syntax-error", Message: "SyntaxError: old ruff", Line: 4, Column: 1},
	}
	assertSameJSON(t, "diagnostics", want, diagnostics)
}

func TestParseRuffJSONOfCleanCodeIsAnEmptyList(t *testing.T) {
	diagnostics, err := ParseRuffJSON([]byte("[]"))
	if err != nil || diagnostics == nil || len(diagnostics) != 0 {
		t.Errorf("diagnostics %#v, error %v", diagnostics, err)
	}
}

func TestParseRuffJSONRejectsOtherOutput(t *testing.T) {
	if _, err := ParseRuffJSON([]byte("main.py:1:8: F401 unused")); err == nil {
		t.Error("no error for text output")
	}
}

func TestRenderDiagnostics(t *testing.T) {
	text := renderDiagnostics("main.py", []Diagnostic{{Code: "F401", Message: "unused", Line: 1, Column: 8}})

	if text != "main.py:1:8: F401 unused\n" {
		t.Errorf("text %q", text)
	}
}
