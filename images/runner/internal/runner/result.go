package runner

import (
	"encoding/json"
	"os"
	"unicode/utf8"
)

const (
	// MaxTerminationMessageBytes is the kubelet's limit for a container's
	// termination message.
	MaxTerminationMessageBytes = 4096

	// ExitCodeReported is the runner's exit status once its summary is
	// written, whatever became of the program: the program's own status is
	// only in the summary.
	ExitCodeReported = 0
	// ExitCodeUsage is for -h and the like: no run, no summary.
	ExitCodeUsage = 2
	// ExitCodeNoSummary means the runner could not write its summary; any
	// summary found is not the runner's.
	ExitCodeNoSummary = 125
)

// Result is the summary of one run: the last pod log record and the
// termination message.
type Result struct {
	// ExitCode is the program's exit status when it exited by itself; null when
	// it was killed by a signal or never started.
	ExitCode *int `json:"exitCode"`
	// Signal is the number of the signal that killed the program, or null.
	Signal   *int `json:"signal"`
	TimedOut bool `json:"timedOut"`
	// MemoryExceeded: the runner killed the run when the memory it held
	// passed MemoryLimitBytes (the config's memoryLimitBytes), given then only.
	MemoryExceeded   bool         `json:"memoryExceeded,omitempty"`
	MemoryLimitBytes *int64       `json:"memoryLimitBytes,omitempty"`
	DurationMs       int64        `json:"durationMs"`
	StdoutBytes      int64        `json:"stdoutBytes"`
	StderrBytes      int64        `json:"stderrBytes"`
	StdoutTruncated  bool         `json:"stdoutTruncated"`
	StderrTruncated  bool         `json:"stderrTruncated"`
	PeakMemoryBytes  *int64       `json:"peakMemoryBytes"`
	Diagnostics      []Diagnostic `json:"diagnostics"`
	// Error says why the runner could not run the program; ExitCode is then null.
	Error *string `json:"error"`
	// Value is the repr of the trailing expression's value (or null), for the
	// python programs the bootstrap or a session's kernel ran (value.go).
	// StateLost and Kernel are there in session mode only (session.go):
	// whether the interpreter's state was lost by or before this run, and
	// whether the run went through the session's kernel, whose answer (exit
	// status, value, the output it wrote) earlier runs of the session can have
	// changed.
	Value     *programValue `json:"value,omitempty"`
	StateLost *bool         `json:"stateLost,omitempty"`
	Kernel    *bool         `json:"kernel,omitempty"`
	// Cancelled (serve and session mode): POST /v1/cancel stopped the run
	// before it had ended by itself; omitted otherwise.
	Cancelled bool `json:"cancelled,omitempty"`
	// Retiring (serve mode): the sandbox takes no further run after this
	// one (it serves one run, or its runs or age are used up, or this run
	// left something behind); omitted in session mode.
	Retiring bool `json:"retiring,omitempty"`
	// Compile is the compile step's outcome when the language has one; when it
	// failed the program did not run (ExitCode and Signal are null).
	Compile *CompileResult `json:"compile,omitempty"`
	// Outputs lists the files that came back as file frames (null in lint
	// mode, and in a termination message they would not fit in).
	Outputs []OutputFile `json:"outputs"`
	// OutputsTruncated: a limit left files out; OutputsSkipped counts entries
	// not collected (symlinks, fifos, devices, too large, ...).
	OutputsTruncated bool `json:"outputsTruncated"`
	OutputsSkipped   int  `json:"outputsSkipped"`
}

// programValue is text or null, present only where Value is.
type programValue struct {
	Text *string
}

func (v programValue) MarshalJSON() ([]byte, error) {
	return json.Marshal(v.Text)
}

func (v *programValue) UnmarshalJSON(data []byte) error {
	return json.Unmarshal(data, &v.Text)
}

// Diagnostic is one lint finding, with 1-based line and column.
type Diagnostic struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line"`
	Column  int    `json:"column"`
}

func failedResult(err error) Result {
	message := err.Error()
	return Result{Error: &message}
}

// TerminationMessage encodes the summary in at most MaxTerminationMessageBytes,
// dropping the diagnostics, the outputs list, the compiler's output and a
// session value, then shortening the error, when it does not fit.
func TerminationMessage(summary summaryRecord) []byte {
	message := marshalJSONLine(summary)
	if len(message) <= MaxTerminationMessageBytes {
		return message
	}
	result := &summary.Result
	result.Diagnostics = nil
	result.Outputs = nil
	if result.Compile != nil {
		withoutOutput := *result.Compile
		withoutOutput.Output = ""
		result.Compile = &withoutOutput
	}
	if result.Value != nil {
		result.Value = &programValue{}
	}
	message = marshalJSONLine(summary)
	if len(message) <= MaxTerminationMessageBytes || result.Error == nil {
		return message
	}
	errorText := *result.Error
	encodeWithErrorPrefix := func(length int) []byte {
		for length > 0 && length < len(errorText) && !utf8.RuneStart(errorText[length]) {
			length--
		}
		shortened := errorText[:length] + "…"
		result.Error = &shortened
		return marshalJSONLine(summary)
	}
	// JSON escaping makes the encoded length of a prefix hard to predict:
	// search for the longest prefix that fits.
	shortest, longest := 0, len(errorText)
	for shortest < longest {
		middle := (shortest + longest + 1) / 2
		if len(encodeWithErrorPrefix(middle)) <= MaxTerminationMessageBytes {
			shortest = middle
		} else {
			longest = middle - 1
		}
	}
	return encodeWithErrorPrefix(shortest)
}

// writeTerminationLog replaces whatever the file holds (the program may have
// written there) with the summary.
func writeTerminationLog(path string, summary summaryRecord) error {
	return os.WriteFile(path, TerminationMessage(summary), 0o644)
}
