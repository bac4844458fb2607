package runner

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

const (
	sourceKey = "source"
	stdinKey  = "stdin"

	// DefaultPath is the program's PATH unless config.env sets another.
	DefaultPath = "/usr/local/bin:/usr/bin:/bin"
)

// prepareWorkDir creates workDir and places the source and the extra files in it.
func prepareWorkDir(cfg *Config, inputDir, workDir string) error {
	if err := createWorkDir(workDir); err != nil {
		return err
	}
	if err := copyInputFile(filepath.Join(inputDir, sourceKey), filepath.Join(workDir, cfg.SourceFile)); err != nil {
		return err
	}
	for _, file := range cfg.Files {
		if err := copyInputFile(filepath.Join(inputDir, file.Key), filepath.Join(workDir, file.Path)); err != nil {
			return err
		}
	}
	return nil
}

// createWorkDir creates workDir and an empty outputs dir next to it.
func createWorkDir(workDir string) error {
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return fmt.Errorf("creating the work dir: %w", err)
	}
	return resetOutputsDir(outputsDir(workDir))
}

func copyInputFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("reading input file: %w", err)
	}
	defer in.Close()
	return writeWorkFile(dst, in, src)
}

// writeWorkFile creates dst (and its directory) with the content of in, which
// comes from src (for messages).
func writeWorkFile(dst string, in io.Reader, src string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating the directory of %s: %w", dst, err)
	}
	// O_EXCL: two inputs mapped to one path is a bad config, not a silent overwrite.
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}

// openStdin opens the program's standard input: the stdin input file when
// fromInput, else /dev/null.
func openStdin(fromInput bool, inputDir string) (*os.File, error) {
	path := os.DevNull
	if fromInput {
		path = filepath.Join(inputDir, stdinKey)
	}
	stdin, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening stdin: %w", err)
	}
	return stdin, nil
}

// programEnv is the clean base environment with config.env merged over it,
// sorted by name.
func programEnv(extra map[string]string, workDir string) []string {
	vars := map[string]string{
		"PATH":     DefaultPath,
		"LANG":     "C.UTF-8",
		"HOME":     workDir,
		"TMPDIR":   filepath.Dir(workDir),
		OutputsEnv: outputsDir(workDir),
	}
	maps.Copy(vars, extra)
	env := make([]string, 0, len(vars))
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, name+"="+vars[name])
	}
	return env
}
