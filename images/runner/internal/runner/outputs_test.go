package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// collected is a collection of dir, its frames verified and reassembled.
type collected struct {
	report outputsReport
	files  map[string][]byte
}

func collect(t *testing.T, dir string, cfg Config) collected {
	t.Helper()
	var log bytes.Buffer
	key := testFrameKey()
	frames := newFrameWriter(&log, key)
	report := collectOutputs(dir, cfg, frames)
	result := collected{report: report, files: map[string][]byte{}}
	for i, frame := range decodeFrames(t, log.Bytes()) {
		if frame.Seq != uint64(i+1) || !verifyFrame(key, frame) {
			t.Fatalf("frame %d does not verify: %+v", i+1, frame)
		}
		path, ok := strings.CutPrefix(frame.Stream, FileStreamPrefix)
		if !ok {
			t.Fatalf("frame %d is not a file frame: %q", i+1, frame.Stream)
		}
		chunk, err := base64.StdEncoding.DecodeString(frame.Data)
		if err != nil {
			t.Fatalf("frame %d: %v", i+1, err)
		}
		result.files[path] = append(result.files[path], chunk...)
	}
	return result
}

func decodeFrames(t *testing.T, log []byte) []outputFrame {
	t.Helper()
	var frames []outputFrame
	for _, line := range bytes.Split(bytes.TrimSuffix(log, []byte("\n")), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var frame outputFrame
		if err := jsonStrict(line, &frame); err != nil {
			t.Fatalf("not a frame: %q (%v)", line, err)
		}
		frames = append(frames, frame)
	}
	return frames
}

func outputsConfig() Config {
	return Config{MaxOutputFiles: DefaultMaxOutputFiles, MaxOutputFilesBytes: DefaultMaxOutputFilesBytes}
}

func writeFiles(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func TestCollectOutputsFramesRegularFilesWithTheirDigest(t *testing.T) {
	dir := t.TempDir()
	binary := make([]byte, 3*fileChunkBytes+17)
	for i := range binary {
		binary[i] = byte(i * 7)
	}
	want := map[string][]byte{"plot.png": binary, "data/table.csv": []byte("a,b\n1,2\n"), "empty.txt": {}}
	writeFiles(t, dir, want)

	got := collect(t, dir, outputsConfig())

	if got.report.truncated || got.report.skipped != 0 || len(got.report.files) != 3 {
		t.Fatalf("report %+v", got.report)
	}
	mediaTypes := map[string]string{"plot.png": "image/png", "data/table.csv": "text/csv", "empty.txt": "text/plain"}
	for _, file := range got.report.files {
		content := want[file.Path]
		if file.Size != int64(len(content)) || file.SHA256 != sha256Hex(content) || file.MediaType != mediaTypes[file.Path] {
			t.Errorf("listing %+v", file)
		}
		if !bytes.Equal(got.files[file.Path], content) {
			t.Errorf("%s came back as %d bytes, want %d", file.Path, len(got.files[file.Path]), len(content))
		}
	}
}

func TestCollectOutputsSkipsASymlinkWithoutFollowingIt(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"kept.txt": []byte("kept")})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(dir, "etc")); err != nil {
		t.Fatal(err)
	}

	got := collect(t, dir, outputsConfig())

	if len(got.report.files) != 1 || got.report.files[0].Path != "kept.txt" || got.report.skipped != 2 || got.report.truncated {
		t.Fatalf("report %+v", got.report)
	}
	if len(got.files) != 1 {
		t.Errorf("frames of %d files, want only kept.txt", len(got.files))
	}
}

func TestCollectOutputsOfADirReplacedByASymlinkIsEmpty(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "outputs")
	if err := os.Symlink("/etc", dir); err != nil {
		t.Fatal(err)
	}
	got := collect(t, dir, outputsConfig())
	if len(got.report.files) != 0 || got.report.skipped != 1 || len(got.files) != 0 {
		t.Fatalf("report %+v", got.report)
	}
}

// How long these collections take is BenchmarkCollectOutputs's to measure.
func TestCollectOutputsSkipsAHugeSparseFile(t *testing.T) {
	dir := hugeSparseFileDir(t)

	got := collect(t, dir, outputsConfig())

	if len(got.report.files) != 1 || got.report.files[0].Path != "small.txt" || got.report.skipped != 1 || !got.report.truncated {
		t.Fatalf("report %+v", got.report)
	}
}

func TestCollectOutputsStopsAtTheLimitAmongTenThousandFiles(t *testing.T) {
	dir := tenThousandFilesDir(t)

	got := collect(t, dir, outputsConfig())

	if len(got.report.files) != DefaultMaxOutputFiles || !got.report.truncated || len(got.files) != DefaultMaxOutputFiles {
		t.Fatalf("%d files, truncated %v", len(got.report.files), got.report.truncated)
	}
}

// hugeSparseFileDir is a directory with small.txt and a 10 GiB sparse file,
// huge.bin; it skips where sparse files cannot be made.
func hugeSparseFileDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	writeFiles(tb, dir, map[string][]byte{"small.txt": []byte("small")})
	if err := os.WriteFile(filepath.Join(dir, "huge.bin"), nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "huge.bin"), 10<<30); err != nil {
		tb.Skipf("no sparse files here: %v", err)
	}
	return dir
}

// tenThousandFilesDir is a directory of 10,000 one-byte files.
func tenThousandFilesDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	for i := range 10_000 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.txt", i)), []byte("x"), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

func TestCollectOutputsKeepsWithinItsByteLimit(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"a.bin": make([]byte, 600), "b.bin": make([]byte, 600), "c.bin": make([]byte, 300)})
	cfg := outputsConfig()
	cfg.MaxOutputFilesBytes = 1000

	got := collect(t, dir, cfg)

	var total int64
	for _, file := range got.report.files {
		total += file.Size
	}
	if len(got.report.files) != 2 || total != 900 || !got.report.truncated || got.report.skipped != 1 {
		t.Fatalf("report %+v", got.report)
	}
}

func TestCollectOutputsSkipsFifosSocketsAndDevices(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"kept.txt": []byte("kept")})
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	listener, err := net.Listen("unix", filepath.Join(dir, "socket"))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	want := 2
	// A character device like /dev/zero (1, 5): only where mknod is allowed (root).
	if syscall.Mknod(filepath.Join(dir, "zero"), syscall.S_IFCHR|0o644, 1<<8|5) == nil {
		want++
	} else {
		t.Log("mknod is not permitted here: no device in this test")
	}
	done := make(chan collected, 1)
	go func() { done <- collect(t, dir, outputsConfig()) }()

	select {
	case got := <-done:
		if len(got.report.files) != 1 || got.report.skipped != want || got.report.truncated {
			t.Fatalf("report %+v, want %d skipped", got.report, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the collection blocked (on the fifo?)")
	}
}

func TestCollectOutputsBoundsTheDepth(t *testing.T) {
	dir := t.TempDir()
	deep := filepath.Join(append([]string{dir}, strings.Split(strings.Repeat("d/", 20), "/")...)...)
	writeFiles(t, deep, map[string][]byte{"deep.txt": []byte("deep")})
	writeFiles(t, dir, map[string][]byte{"top.txt": []byte("top")})

	got := collect(t, dir, outputsConfig())

	if len(got.report.files) != 1 || got.report.files[0].Path != "top.txt" || !got.report.truncated {
		t.Fatalf("report %+v", got.report)
	}
}

func TestMediaTypeComesFromTheExtension(t *testing.T) {
	for name, want := range map[string]string{"a.PNG": "image/png", "b.svg": "image/svg+xml", "c": "application/octet-stream", "d.exe": "application/octet-stream"} {
		if got := mediaTypeOf(name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}

func TestRunReturnsTheFilesTheProgramLeftInItsOutputsDir(t *testing.T) {
	f := newShellFixture(t, `printf 'a,b\n1,2\n' > "$SANDPOD_OUTPUTS/table.csv"; ln -s /etc/passwd "$SANDPOD_OUTPUTS/passwd"; echo done`)
	stale := outputsDir(f.opts.WorkDir)
	writeFiles(t, stale, map[string][]byte{"stale.txt": []byte("from before")})

	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	want := []OutputFile{{Path: "table.csv", Size: 8, SHA256: sha256Hex([]byte("a,b\n1,2\n")), MediaType: "text/csv"}}
	assertSameJSON(t, "outputs", want, output.result.Outputs)
	if output.result.OutputsSkipped != 1 || output.result.OutputsTruncated {
		t.Errorf("skipped %d, truncated %v", output.result.OutputsSkipped, output.result.OutputsTruncated)
	}
	content, err := base64.StdEncoding.DecodeString(output.text(FileStreamPrefix + "table.csv"))
	if err != nil || string(content) != "a,b\n1,2\n" {
		t.Errorf("file frames %q (%v)", content, err)
	}
}

func TestTerminationMessageDropsTheOutputsListBeyond4KiB(t *testing.T) {
	outputs := make([]OutputFile, 64)
	for i := range outputs {
		outputs[i] = OutputFile{Path: fmt.Sprintf("figure-%d.png", i), Size: 1, SHA256: strings.Repeat("0", 64), MediaType: "image/png"}
	}
	summary := summaryRecord{Result: Result{ExitCode: intPtr(0), Outputs: outputs, OutputsSkipped: 3}, Key: strings.Repeat("a", 64)}
	var decoded summaryRecord
	message := TerminationMessage(summary)
	if err := jsonStrict(message, &decoded); err != nil || len(message) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes (%v)", len(message), err)
	}
	if decoded.Result.Outputs != nil || decoded.Result.OutputsSkipped != 3 {
		t.Errorf("result %+v", decoded.Result)
	}
}

func jsonStrict(data []byte, into any) error {
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	return decoder.Decode(into)
}

func TestServeReturnsOutputsAndTakesBase64Files(t *testing.T) {
	f := newPythonFixture(t, `import os, pathlib
data = pathlib.Path("in.bin").read_bytes()
pathlib.Path(os.environ["SANDPOD_OUTPUTS"], "out.bin").write_bytes(data[::-1])
`)
	s := f.serve()
	request := s.request("exec-1")
	request.Files = []inlineFile{{Path: "in.bin", Content: base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255}), Encoding: "base64"}}
	response := s.post(request, s.bearer())
	assertStatus(t, response, 200)

	output := f.decodeLog(readStream(t, response))

	assertExit(t, output, intPtr(0), nil)
	want := []byte{255, 2, 1, 0}
	content, err := base64.StdEncoding.DecodeString(output.text(FileStreamPrefix + "out.bin"))
	if err != nil || !bytes.Equal(content, want) {
		t.Fatalf("out.bin came back as %v (%v)", content, err)
	}
	assertSameJSON(t, "outputs", []OutputFile{{Path: "out.bin", Size: 4, SHA256: sha256Hex(want), MediaType: "application/octet-stream"}}, output.result.Outputs)
}

func TestCollectOutputsStopsLookingOnceTheFileLimitIsReached(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"a.txt": []byte("a"), "b.txt": []byte("b"), "c.txt": []byte("c")})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "d-link")); err != nil {
		t.Fatal(err)
	}
	cfg := outputsConfig()
	cfg.MaxOutputFiles = 2

	got := collect(t, dir, cfg)

	if len(got.report.files) != 2 || !got.report.truncated || got.report.skipped != 0 {
		t.Fatalf("report %+v", got.report)
	}
}

// fileNameCase is an entry of testdata/file_names.json, the table the
// contract's Python rule is tested against too.
type fileNameCase struct {
	Name      string `json:"name"`
	Refused   bool   `json:"refused"`
	Character string `json:"character"`
}

func fileNameCases(t *testing.T) []fileNameCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "file_names.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		About string         `json:"about"`
		Names []fileNameCase `json:"names"`
	}
	if err := jsonStrict(data, &table); err != nil {
		t.Fatal(err)
	}
	return table.Names
}

func TestRefusedNameRuneFollowsTheSharedTable(t *testing.T) {
	for _, c := range fileNameCases(t) {
		r, refused := refusedNameRune(c.Name)
		if refused != c.Refused {
			t.Errorf("%q: refused %v, want %v", c.Name, refused, c.Refused)
			continue
		}
		if want, _, _ := strings.Cut(c.Character, " "); refused && fmt.Sprintf("U+%04X", r) != want {
			t.Errorf("%q: refused for U+%04X, want %s", c.Name, r, c.Character)
		}
	}
}

func TestCollectOutputsSkipsNamesThatCouldShowAsAnother(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{}
	refused := 0
	for _, c := range fileNameCases(t) {
		if strings.ContainsRune(c.Name, 0) {
			continue // no file system takes it
		}
		files[c.Name] = []byte(c.Name)
		if c.Refused {
			refused++
		}
	}
	writeFiles(t, dir, files)

	got := collect(t, dir, outputsConfig())

	if got.report.skipped != refused || got.report.truncated || len(got.report.files) != len(files)-refused {
		t.Fatalf("%d kept, %d skipped (want %d), truncated %v", len(got.report.files), got.report.skipped, refused, got.report.truncated)
	}
	for _, file := range got.report.files {
		if _, bad := refusedNameRune(file.Path); bad || !bytes.Equal(got.files[file.Path], []byte(file.Path)) {
			t.Errorf("kept %q", file.Path)
		}
	}
	for path := range got.files {
		if _, bad := refusedNameRune(path); bad {
			t.Errorf("frames of %q", path)
		}
	}
}
