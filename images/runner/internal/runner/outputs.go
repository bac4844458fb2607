package runner

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

const (
	// OutputsEnv names the outputs directory in the program's environment.
	OutputsEnv     = "SANDPOD_OUTPUTS"
	outputsDirName = "outputs"

	DefaultMaxOutputFiles      = 64
	DefaultMaxOutputFilesBytes = 8 << 20

	// FileStreamPrefix starts the stream of a file frame: "file:<relative path>".
	FileStreamPrefix = "file:"
	// fileChunkBytes of a file become one frame: 8 KiB of base64.
	fileChunkBytes = 6 << 10

	// The walk is bounded whatever the directory holds: entries looked at (each
	// costs one open and one fstat), directory depth, and path length.
	maxOutputEntries   = 1024
	maxOutputDepth     = 8
	maxOutputPathBytes = 255

	// oPath opens a name without opening the file itself (no fifo blocks, no
	// device driver runs): O_PATH, which package syscall does not export.
	oPath = 0x200000
)

// OutputFile is a file the program left in the outputs directory that came
// back as file frames.
type OutputFile struct {
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	MediaType string `json:"mediaType"`
}

// outputsReport is what the collection adds to the result.
type outputsReport struct {
	files     []OutputFile
	truncated bool
	skipped   int
}

// outputsDir is where the program leaves files to come back: next to the work
// dir (/tmp/outputs for /tmp/work).
func outputsDir(workDir string) string {
	return filepath.Join(filepath.Dir(workDir), outputsDirName)
}

// resetOutputsDir leaves dir empty before a run. RemoveAll does not follow
// symlinks, so whatever was there cannot point it elsewhere.
func resetOutputsDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("emptying the outputs dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating the outputs dir: %w", err)
	}
	return nil
}

// outputCollector walks the outputs directory after the run, without ever
// following a symlink: every name is opened relative to its directory's
// descriptor with O_NOFOLLOW, and a file is read only when the descriptor
// opened for reading is the regular file that was looked at.
type outputCollector struct {
	frames      *frameWriter
	filesLeft   int
	bytesLeft   int64
	framedRoom  int64
	entriesLeft int
	report      outputsReport
}

// collectOutputs frames the regular files under dir, within cfg's limits and
// their own framed budget, once nothing else runs any more.
func collectOutputs(dir string, cfg Config, frames *frameWriter) outputsReport {
	c := &outputCollector{
		frames:      frames,
		filesLeft:   cfg.MaxOutputFiles,
		bytesLeft:   cfg.MaxOutputFilesBytes,
		framedRoom:  framedBudget(cfg.MaxOutputFilesBytes),
		entriesLeft: maxOutputEntries,
	}
	c.report.files = []OutputFile{}
	root, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		// Removed or replaced (by a symlink, say) by the program: nothing to collect.
		c.report.skipped++
		return c.report
	}
	c.walk(root, "", 0)
	return c.report
}

// walk collects the entries of the directory open as fd (which it closes).
func (c *outputCollector) walk(fd int, prefix string, depth int) {
	dir := os.NewFile(uintptr(fd), prefix)
	defer dir.Close()
	// One more than may be looked at: it tells that something was left out.
	names, err := dir.Readdirnames(c.entriesLeft + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		c.report.skipped++
		return
	}
	slices.Sort(names)
	for _, name := range names {
		if c.filesLeft == 0 || c.entriesLeft == 0 {
			// Nothing more can come back: what is left is left out, unexamined.
			c.report.truncated = true
			return
		}
		c.entriesLeft--
		c.entry(fd, name, path.Join(prefix, name), depth)
	}
}

func (c *outputCollector) entry(dirFd int, name, relative string, depth int) {
	probe, err := syscall.Openat(dirFd, name, oPath|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		c.report.skipped++
		return
	}
	var seen syscall.Stat_t
	err = syscall.Fstat(probe, &seen)
	_ = syscall.Close(probe)
	if err != nil {
		c.report.skipped++
		return
	}
	switch seen.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		c.directory(dirFd, name, relative, depth, seen)
	case syscall.S_IFREG:
		c.file(dirFd, name, relative, seen)
	default:
		// A symlink, fifo, socket or device: never opened.
		c.report.skipped++
	}
}

func (c *outputCollector) directory(dirFd int, name, relative string, depth int, seen syscall.Stat_t) {
	if depth+1 >= maxOutputDepth {
		c.report.truncated = true
		return
	}
	if fd, ok := c.open(dirFd, name, syscall.O_RDONLY|syscall.O_DIRECTORY, seen); ok {
		c.walk(fd, relative, depth+1)
	}
}

func (c *outputCollector) file(dirFd int, name, relative string, seen syscall.Stat_t) {
	if !validOutputPath(relative) {
		c.report.skipped++
		return
	}
	// By the size the file claims: a huge sparse file is never read.
	if seen.Size > c.bytesLeft || fileFramesCost(relative, seen.Size) > c.framedRoom {
		c.report.skipped++
		c.report.truncated = true
		return
	}
	fd, ok := c.open(dirFd, name, syscall.O_RDONLY|syscall.O_NONBLOCK, seen)
	if !ok {
		return
	}
	file := os.NewFile(uintptr(fd), relative)
	defer file.Close()
	output, err := c.frameFile(file, relative, seen.Size)
	if err != nil {
		// Frames of a file cut short do not match its (missing) listing:
		// the decoder drops them.
		c.report.skipped++
		return
	}
	c.filesLeft--
	c.bytesLeft -= output.Size
	c.report.files = append(c.report.files, output)
}

// frameFile writes the first size bytes of file as file frames.
func (c *outputCollector) frameFile(file io.Reader, relative string, size int64) (OutputFile, error) {
	stream := FileStreamPrefix + relative
	digest := sha256.New()
	chunk := make([]byte, fileChunkBytes)
	var total int64
	reader := io.LimitReader(file, size)
	for {
		n, err := io.ReadFull(reader, chunk)
		if n > 0 {
			written := c.frames.writeOutput(stream, base64.StdEncoding.EncodeToString(chunk[:n]), c.framedRoom)
			if written == 0 {
				return OutputFile{}, errors.New("over the framed budget")
			}
			c.framedRoom -= written
			writeHash(digest, chunk[:n])
			total += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return OutputFile{}, err
		}
	}
	return OutputFile{
		Path:      relative,
		Size:      total,
		SHA256:    hex.EncodeToString(digest.Sum(nil)),
		MediaType: mediaTypeOf(relative),
	}, nil
}

func writeHash(digest hash.Hash, data []byte) {
	_, _ = digest.Write(data)
}

// open is openSame, counting what it could not open as skipped.
func (c *outputCollector) open(dirFd int, name string, flags int, seen syscall.Stat_t) (int, bool) {
	fd, ok := openSame(dirFd, name, flags, seen)
	if !ok {
		c.report.skipped++
	}
	return fd, ok
}

// openSame opens name in dirFd without following a symlink, and only if it is
// still the object seen (same device and inode, same type).
func openSame(dirFd int, name string, flags int, seen syscall.Stat_t) (int, bool) {
	fd, err := syscall.Openat(dirFd, name, flags|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, false
	}
	var opened syscall.Stat_t
	if syscall.Fstat(fd, &opened) != nil || opened.Dev != seen.Dev || opened.Ino != seen.Ino ||
		opened.Mode&syscall.S_IFMT != seen.Mode&syscall.S_IFMT {
		_ = syscall.Close(fd)
		return -1, false
	}
	return fd, true
}

// fileFramesCost is the most pod log bytes the frames of a file can take.
func fileFramesCost(relative string, size int64) int64 {
	const perFrame = 4*fileChunkBytes/3 + 160
	frames := (size + fileChunkBytes - 1) / fileChunkBytes
	return frames * (perFrame + 6*int64(len(relative)+len(FileStreamPrefix)))
}

// validOutputPath keeps names that travel well into a status and an HTTP path
// and that a person can trust on sight: UTF-8, not too long, and no character
// the file name rule refuses.
func validOutputPath(relative string) bool {
	_, refused := refusedNameRune(relative)
	return len(relative) <= maxOutputPathBytes && utf8.ValidString(relative) && !refused
}

// refusedNameRune is the first character of name that the file name rule
// refuses, the same rule as sandpod_contract.file_names: control characters
// (Cc), format characters (Cf: the bidirectional controls such as U+202E
// RIGHT-TO-LEFT OVERRIDE and the zero-width ones such as U+200B), line and
// paragraph separators (Zl, Zp). Such a name could show as another one
// ("report\u202etxt.exe" reads "reportexe.txt"). Both implementations are
// tested against testdata/file_names.json.
func refusedNameRune(name string) (rune, bool) {
	for _, r := range name {
		if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) {
			return r, true
		}
	}
	return 0, false
}

var mediaTypes = map[string]string{
	".png":     "image/png",
	".jpg":     "image/jpeg",
	".jpeg":    "image/jpeg",
	".gif":     "image/gif",
	".webp":    "image/webp",
	".svg":     "image/svg+xml",
	".pdf":     "application/pdf",
	".csv":     "text/csv",
	".tsv":     "text/tab-separated-values",
	".txt":     "text/plain",
	".log":     "text/plain",
	".md":      "text/markdown",
	".html":    "text/html",
	".htm":     "text/html",
	".json":    "application/json",
	".xml":     "application/xml",
	".zip":     "application/zip",
	".gz":      "application/gzip",
	".tar":     "application/x-tar",
	".parquet": "application/vnd.apache.parquet",
}

// mediaTypeOf is the media type of a file name's extension, from a fixed table
// (never from the content the program chose).
func mediaTypeOf(name string) string {
	if mediaType, ok := mediaTypes[strings.ToLower(path.Ext(name))]; ok {
		return mediaType
	}
	return "application/octet-stream"
}

// addOutputs puts the collection into the result.
func (r *Result) addOutputs(report outputsReport) {
	r.Outputs = report.files
	r.OutputsTruncated = report.truncated
	r.OutputsSkipped = report.skipped
}
