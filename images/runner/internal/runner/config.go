// Package runner implements the in-sandbox side of docs/runner-protocol.md:
// it reads the run configuration, starts the program with rlimits in a clean
// environment, frames its output and reports the result.
package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	ModeRun  = "run"
	ModeLint = "lint"

	DefaultMaxOutputBytes = 1 << 20
)

// Config is config.json as the operator writes it.
type Config struct {
	Mode           string   `json:"mode"`
	SourceFile     string   `json:"sourceFile"`
	Command        []string `json:"command"`
	LintCommand    []string `json:"lintCommand,omitempty"`
	CompileCommand []string `json:"compileCommand,omitempty"` // run mode only: compile.go
	// CompileTimeoutSeconds is the compile step's own time limit, apart from
	// the program's TimeoutSeconds (required with CompileCommand).
	CompileTimeoutSeconds int               `json:"compileTimeoutSeconds,omitempty"`
	Args                  []string          `json:"args"`
	Env                   map[string]string `json:"env"`
	TimeoutSeconds        int               `json:"timeoutSeconds"`
	MaxOutputBytes        int64             `json:"maxOutputBytes"`
	// MaxOutputFiles and MaxOutputFilesBytes bound what comes back from the
	// outputs directory (outputs.go).
	MaxOutputFiles      int           `json:"maxOutputFiles"`
	MaxOutputFilesBytes int64         `json:"maxOutputFilesBytes"`
	Files               []FileMapping `json:"files"`
	HasStdin            bool          `json:"hasStdin"`
	Limits              Limits        `json:"limits"`
	// MemoryLimitBytes bounds the memory the run holds, its processes' and
	// its scratch files' (memory.go): past it the run is killed and its
	// result says memoryExceeded. 0: no bound of the runner's own. Unlike
	// Limits it may differ between the runs of one serving sandbox.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
	// MaxRuns (serve mode's config only): above 1, the sandbox serves up to
	// that many runs, one at a time, each in a fresh box (box.go), and for
	// at most MaxAgeSeconds (0: no bound) from its start.
	MaxRuns       int `json:"maxRuns,omitempty"`
	MaxAgeSeconds int `json:"maxAgeSeconds,omitempty"`
}

// FileMapping places the input file Key at Path, relative to the work dir.
type FileMapping struct {
	Key  string `json:"key"`
	Path string `json:"path"`
}

// Limits are the rlimits applied to the program. Zero leaves a limit as inherited.
type Limits struct {
	Processes     uint64 `json:"processes"`
	FileSizeBytes uint64 `json:"fileSizeBytes"`
	OpenFiles     uint64 `json:"openFiles"`
}

// LoadConfig reads and validates a config.json file.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading config: %w", err)
	}
	return ParseConfig(data)
}

// ParseConfig decodes and validates config.json content, filling defaults.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("parsing config: %w", err)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeRun
	}
	if cfg.MaxOutputBytes == 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.MaxOutputFiles == 0 {
		cfg.MaxOutputFiles = DefaultMaxOutputFiles
	}
	if cfg.MaxOutputFilesBytes == 0 {
		cfg.MaxOutputFilesBytes = DefaultMaxOutputFilesBytes
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("invalid config: %w", err)
	}
	return cfg, nil
}

func (c *Config) validate() error {
	var problems []error
	switch c.Mode {
	case ModeRun:
		if len(c.Command) == 0 || c.Command[0] == "" {
			problems = append(problems, errors.New("command must not be empty in run mode"))
		}
	case ModeLint:
		if len(c.LintCommand) == 0 || c.LintCommand[0] == "" {
			problems = append(problems, errors.New("lintCommand must not be empty in lint mode"))
		}
	default:
		problems = append(problems, fmt.Errorf("unknown mode %q", c.Mode))
	}
	if len(c.CompileCommand) > 0 && c.CompileCommand[0] == "" {
		problems = append(problems, errors.New("compileCommand must not start with an empty name"))
	}
	if len(c.CompileCommand) > 0 && c.CompileTimeoutSeconds <= 0 {
		problems = append(problems, fmt.Errorf("compileTimeoutSeconds must be positive with a compileCommand, got %d", c.CompileTimeoutSeconds))
	}
	if !filepath.IsLocal(c.SourceFile) {
		problems = append(problems, fmt.Errorf("sourceFile %q is not a relative path inside the work dir", c.SourceFile))
	}
	if c.TimeoutSeconds <= 0 {
		problems = append(problems, fmt.Errorf("timeoutSeconds must be positive, got %d", c.TimeoutSeconds))
	}
	if c.MaxOutputBytes < 0 {
		problems = append(problems, fmt.Errorf("maxOutputBytes must not be negative, got %d", c.MaxOutputBytes))
	}
	if c.MaxRuns < 0 || c.MaxAgeSeconds < 0 {
		problems = append(problems, errors.New("maxRuns and maxAgeSeconds must not be negative"))
	}
	if c.MemoryLimitBytes < 0 {
		problems = append(problems, fmt.Errorf("memoryLimitBytes must not be negative, got %d", c.MemoryLimitBytes))
	}
	if c.MaxOutputFiles < 0 || c.MaxOutputFilesBytes < 0 {
		problems = append(problems, errors.New("maxOutputFiles and maxOutputFilesBytes must not be negative"))
	}
	for _, f := range c.Files {
		if !isPlainFileName(f.Key) {
			problems = append(problems, fmt.Errorf("file key %q is not a plain file name", f.Key))
		}
		if !filepath.IsLocal(f.Path) {
			problems = append(problems, fmt.Errorf("file path %q is not a relative path inside the work dir", f.Path))
		}
	}
	for name, value := range c.Env {
		if name == "" || strings.ContainsAny(name, "=\x00") || strings.ContainsRune(value, 0) {
			problems = append(problems, fmt.Errorf("invalid environment variable %q", name))
		}
	}
	return errors.Join(problems...)
}

func isPlainFileName(name string) bool {
	return filepath.IsLocal(name) && !strings.ContainsRune(name, filepath.Separator)
}
