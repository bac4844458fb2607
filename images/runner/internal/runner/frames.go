package runner

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strconv"
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

	frameKeyBytes = 32
	frameMACBytes = 16
	// frameMACDomain starts every MAC'd message, so a frame MAC can never be
	// mistaken for a MAC of anything else made with the same key.
	frameMACDomain = "sandpod-frame-v1"

	// The framed-bytes budget of a stream is framedBudgetFactor times its
	// maxOutputBytes plus framedBudgetSlack: plain text costs about 1.01
	// times its size in frames, but JSON escaping (up to 6 bytes per byte)
	// and many tiny frames (about 90 bytes of overhead each) cost more.
	framedBudgetFactor = 2
	framedBudgetSlack  = 64 << 10
)

// outputFrame is one piece of a stream in the pod log. Mac authenticates
// Seq, Stream and Data under the run's frame key (see frameMAC).
type outputFrame struct {
	Seq    uint64 `json:"seq"`
	Stream string `json:"stream"`
	Data   string `json:"data"`
	Mac    string `json:"mac"`
}

// summaryRecord is the last pod log line and the termination message: the
// result, how many output frames came before it and the key of their MACs.
type summaryRecord struct {
	Result Result `json:"result"`
	Frames uint64 `json:"frames"`
	Key    string `json:"key"`
}

// newFrameKey draws the run's secret: it lives only in the runner's memory
// until the summary reveals it, after every other process is gone.
func newFrameKey() []byte {
	return randomSecret(frameKeyBytes)
}

func randomSecret(size int) []byte {
	secret := make([]byte, size)
	// crypto/rand.Read never fails on Linux (it crashes the program instead).
	_, _ = rand.Read(secret)
	return secret
}

// frameMAC is the lowercase hex of the first 16 bytes of
// HMAC-SHA256(key, "sandpod-frame-v1" NUL seq NUL stream NUL data), seq in
// decimal and data as UTF-8.
func frameMAC(key []byte, seq uint64, stream, data string) string {
	mac := hmac.New(sha256.New, key)
	message := frameMACDomain + "\x00" + strconv.FormatUint(seq, 10) + "\x00" + stream + "\x00" + data
	_, _ = io.WriteString(mac, message)
	return hex.EncodeToString(mac.Sum(nil)[:frameMACBytes])
}

// verifyFrame is the check the operator makes once the summary gave it key.
func verifyFrame(key []byte, frame outputFrame) bool {
	want := frameMAC(key, frame.Seq, frame.Stream, frame.Data)
	return hmac.Equal([]byte(want), []byte(frame.Mac))
}

// frameWriter writes records as JSON lines, one Write per line, so each record
// reaches the pod log as soon as it is produced. Output frames are numbered
// from 1 in the order they are written. Safe for concurrent use.
type frameWriter struct {
	mu     sync.Mutex
	out    io.Writer
	key    []byte
	frames uint64
}

func newFrameWriter(out io.Writer, key []byte) *frameWriter {
	return &frameWriter{out: out, key: key}
}

// writeOutput frames data as the next output record if its line takes at
// most room bytes, and returns the line's length (0 when it did not fit).
func (f *frameWriter) writeOutput(stream, data string, room int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq := f.frames + 1
	line := marshalJSONLine(outputFrame{Seq: seq, Stream: stream, Data: data, Mac: frameMAC(f.key, seq, stream, data)})
	if int64(len(line)) > room {
		return 0
	}
	f.frames = seq
	// A broken pod log shows in the summary's frame count: the operator
	// finds fewer frames than the summary says.
	_, _ = f.out.Write(line)
	return int64(len(line))
}

// summary is the summary record for result, with the key revealed.
func (f *frameWriter) summary(result Result) summaryRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return summaryRecord{Result: result, Frames: f.frames, Key: hex.EncodeToString(f.key)}
}

// writeSummary writes the summary as the last line.
func (f *frameWriter) writeSummary(summary summaryRecord) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := f.out.Write(marshalJSONLine(summary))
	return err
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

// framedBudget is the most pod log bytes one stream's frames may take.
func framedBudget(maxOutputBytes int64) int64 {
	return framedBudgetFactor*maxOutputBytes + framedBudgetSlack
}

// streamCapture receives one of the program's output streams. It frames the
// first limit bytes as text records, as long as the frames fit in the
// stream's framed budget, and only counts the rest.
type streamCapture struct {
	stream string
	limit  int64
	frames *frameWriter
	total  int64
	// framedRoom is what is left of the framed budget; exhausted is set
	// once a frame did not fit, and nothing more is framed.
	framedRoom int64
	exhausted  bool
	// pending holds the start of a multi-byte UTF-8 sequence that the last
	// write cut off, so that the sequence is framed whole.
	pending []byte
}

func newStreamCapture(stream string, limit int64, frames *frameWriter) *streamCapture {
	return &streamCapture{stream: stream, limit: limit, frames: frames, framedRoom: framedBudget(limit)}
}

// Write never fails, so that a full capture keeps draining the program.
func (s *streamCapture) Write(p []byte) (int, error) {
	room := max(s.limit-s.total, 0)
	s.total += int64(len(p))
	if s.exhausted {
		return len(p), nil
	}
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
	if len(s.pending) > 0 && !s.exhausted {
		s.writeText(toValidText(s.pending))
		s.pending = nil
	}
}

func (s *streamCapture) Total() int64 { return s.total }

// Truncated reports whether the frames miss some of what the program wrote.
func (s *streamCapture) Truncated() bool { return s.total > s.limit || s.exhausted }

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
		written := s.frames.writeOutput(s.stream, text[:cut], s.framedRoom)
		if written == 0 {
			s.exhausted = true
			s.pending = nil
			return
		}
		s.framedRoom -= written
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
