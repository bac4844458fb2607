package runner

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"

	// maxFrameDataBytes bounds one output record, so that pod log lines stay
	// short enough for the container runtime not to split them.
	maxFrameDataBytes = 8 << 10
)

type outputFrame struct {
	Stream string `json:"stream"`
	Data   string `json:"data"`
}

type resultFrame struct {
	Result Result `json:"result"`
}

// frameWriter writes records as JSON lines, one Write per line, so each record
// reaches the pod log as soon as it is produced. Safe for concurrent use.
type frameWriter struct {
	mu  sync.Mutex
	out io.Writer
}

func newFrameWriter(out io.Writer) *frameWriter {
	return &frameWriter{out: out}
}

func (f *frameWriter) write(record any) {
	line := marshalJSONLine(record)
	f.mu.Lock()
	defer f.mu.Unlock()
	// A broken pod log cannot be reported anywhere else; the result still
	// reaches the termination log.
	_, _ = f.out.Write(line)
}

// marshalJSONLine encodes record without HTML escaping, newline-terminated.
// The records are plain structs of strings and numbers, which always encode.
func marshalJSONLine(record any) []byte {
	var buf bytes.Buffer
	encoder := json.NewEncoder(&buf)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(record); err != nil {
		panic("encoding a runner record: " + err.Error())
	}
	return buf.Bytes()
}

// streamCapture receives one of the program's output streams. It frames the
// first limit bytes as text records and only counts the rest.
type streamCapture struct {
	stream string
	limit  int64
	frames *frameWriter
	total  int64
	// pending holds the start of a multi-byte UTF-8 sequence that the last
	// write cut off, so that the sequence is framed whole.
	pending []byte
}

func newStreamCapture(stream string, limit int64, frames *frameWriter) *streamCapture {
	return &streamCapture{stream: stream, limit: limit, frames: frames}
}

// Write never fails, so that a full capture keeps draining the program.
func (s *streamCapture) Write(p []byte) (int, error) {
	room := max(s.limit-s.total, 0)
	s.total += int64(len(p))
	if room > 0 {
		s.emit(p[:min(int64(len(p)), room)])
		if s.total >= s.limit {
			s.finish()
		}
	}
	return len(p), nil
}

// finish frames what is left of an incomplete UTF-8 sequence.
func (s *streamCapture) finish() {
	if len(s.pending) > 0 {
		s.writeText(toValidText(s.pending))
		s.pending = nil
	}
}

func (s *streamCapture) Total() int64 { return s.total }

func (s *streamCapture) Truncated() bool { return s.total > s.limit }

func (s *streamCapture) emit(chunk []byte) {
	data := chunk
	if len(s.pending) > 0 {
		data = append(s.pending, chunk...)
	}
	complete := completeUTF8PrefixLen(data)
	s.pending = append([]byte(nil), data[complete:]...)
	s.writeText(toValidText(data[:complete]))
}

func (s *streamCapture) writeText(text string) {
	for len(text) > 0 {
		cut := len(text)
		if cut > maxFrameDataBytes {
			cut = maxFrameDataBytes
			for cut > 0 && !utf8.RuneStart(text[cut]) {
				cut--
			}
		}
		s.frames.write(outputFrame{Stream: s.stream, Data: text[:cut]})
		text = text[cut:]
	}
}

// completeUTF8PrefixLen returns the length of b without a trailing multi-byte
// sequence that is valid so far but incomplete.
func completeUTF8PrefixLen(b []byte) int {
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// toValidText converts b to a string, replacing each byte that is not part of
// a valid UTF-8 sequence by U+FFFD.
func toValidText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var text strings.Builder
	text.Grow(len(b) + 8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			text.WriteRune(utf8.RuneError)
		} else {
			text.Write(b[:size])
		}
		b = b[size:]
	}
	return text.String()
}

// cappedBuffer keeps the first limit bytes written to it and counts the rest.
type cappedBuffer struct {
	limit int64
	total int64
	data  []byte
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	room := max(c.limit-c.total, 0)
	c.total += int64(len(p))
	c.data = append(c.data, p[:min(int64(len(p)), room)]...)
	return len(p), nil
}

func (c *cappedBuffer) Truncated() bool { return c.total > c.limit }
