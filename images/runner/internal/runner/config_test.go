package runner

import (
	"io"
	"strings"
	"testing"
)

const protocolExampleConfig = `{
  "mode": "run",
  "sourceFile": "main.py",
  "command": ["python3", "main.py"],
  "lintCommand": ["ruff", "check", "--output-format=json", "--no-cache", "--isolated", "main.py"],
  "args": [],
  "env": {"PYTHONUNBUFFERED": "1"},
  "timeoutSeconds": 10,
  "maxOutputBytes": 1048576,
  "maxOutputFiles": 64,
  "maxOutputFilesBytes": 8388608,
  "files": [{"key": "file-0", "path": "data/in.csv"}],
  "hasStdin": false,
  "limits": {"processes": 128, "fileSizeBytes": 104857600, "openFiles": 1024}
}`

func TestParseConfigReadsTheProtocolExample(t *testing.T) {
	cfg, err := ParseConfig([]byte(protocolExampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Mode:                ModeRun,
		SourceFile:          "main.py",
		Command:             []string{"python3", "main.py"},
		LintCommand:         []string{"ruff", "check", "--output-format=json", "--no-cache", "--isolated", "main.py"},
		Args:                []string{},
		Env:                 map[string]string{"PYTHONUNBUFFERED": "1"},
		TimeoutSeconds:      10,
		MaxOutputBytes:      1 << 20,
		MaxOutputFiles:      64,
		MaxOutputFilesBytes: 8 << 20,
		Files:               []FileMapping{{Key: "file-0", Path: "data/in.csv"}},
		Limits:              Limits{Processes: 128, FileSizeBytes: 100 << 20, OpenFiles: 1024},
	}
	assertSameJSON(t, "config", want, cfg)
}

func TestParseConfigFillsDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"sourceFile": "main.sh", "command": ["sh", "main.sh"], "timeoutSeconds": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != ModeRun || cfg.MaxOutputBytes != DefaultMaxOutputBytes {
		t.Errorf("defaults not filled: %+v", cfg)
	}
}

func TestParseConfigRejectsInvalidConfigs(t *testing.T) {
	valid := `"sourceFile": "main.py", "command": ["python3"], "timeoutSeconds": 5`
	cases := map[string]struct{ config, wantError string }{
		"not JSON":             {`{`, "parsing config"},
		"unknown mode":         {`{` + valid + `, "mode": "debug"}`, `unknown mode "debug"`},
		"empty command":        {`{"sourceFile": "main.py", "command": [], "timeoutSeconds": 5}`, "command must not be empty"},
		"lint without command": {`{` + valid + `, "mode": "lint"}`, "lintCommand must not be empty"},
		"absolute source":      {`{"sourceFile": "/etc/passwd", "command": ["python3"], "timeoutSeconds": 5}`, "sourceFile"},
		"zero timeout":         {`{"sourceFile": "main.py", "command": ["python3"], "timeoutSeconds": 0}`, "timeoutSeconds"},
		"negative output cap":  {`{` + valid + `, "maxOutputBytes": -1}`, "maxOutputBytes"},
		"escaping file path":   {`{` + valid + `, "files": [{"key": "file-0", "path": "a/../../x"}]}`, "a/../../x"},
		"key with a directory": {`{` + valid + `, "files": [{"key": "../config.json", "path": "x"}]}`, "file key"},
		"bad env name":         {`{` + valid + `, "env": {"A=B": "1"}}`, "environment variable"},
		"negative limit":       {`{` + valid + `, "limits": {"processes": -1}}`, "parsing config"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("error %v, want one mentioning %q", err, tc.wantError)
			}
		})
	}
}

func TestParseOptionsDefaultsToTheProtocolPaths(t *testing.T) {
	opts, err := ParseOptions(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{
		ConfigPath:         "/sandbox/input/config.json",
		InputDir:           "/sandbox/input",
		WorkDir:            "/tmp/work",
		TerminationLogPath: "/dev/termination-log",
		Listen:             ":7070",
	}
	if opts != want {
		t.Errorf("options %+v, want %+v", opts, want)
	}
}

func TestParseOptionsTakesFlagsAndTheConfigPath(t *testing.T) {
	opts, err := ParseOptions([]string{"-work-dir", "/w", "-termination-log", "/t", "-input-dir", "/i", "/c/config.json"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{ConfigPath: "/c/config.json", InputDir: "/i", WorkDir: "/w", TerminationLogPath: "/t", Listen: ":7070"}
	if opts != want {
		t.Errorf("options %+v, want %+v", opts, want)
	}
}

func TestParseOptionsServeMode(t *testing.T) {
	opts, err := ParseOptions([]string{"--serve", "/s/config.json", "-listen", "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.ServeConfigPath != "/s/config.json" || opts.Listen != "127.0.0.1:0" {
		t.Errorf("options %+v", opts)
	}
	if _, err := ParseOptions([]string{"--serve", "/s/config.json", "/c/config.json"}, io.Discard); err == nil {
		t.Error("serve mode accepted a config path argument")
	}
}

func TestProgramEnvMergesConfigOverTheCleanBase(t *testing.T) {
	env := programEnv(map[string]string{"PYTHONUNBUFFERED": "1", "PATH": "/opt/bin"}, "/tmp/work")

	want := []string{"HOME=/tmp/work", "LANG=C.UTF-8", "PATH=/opt/bin", "PYTHONUNBUFFERED=1", "SANDPOD_OUTPUTS=/tmp/outputs", "TMPDIR=/tmp"}
	assertSameJSON(t, "env", want, env)
}
