package runner

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// captureFrames feeds writes to a stream capture and decodes what it framed.
func captureFrames(t *testing.T, limit int64, writes ...[]byte) ([]outputFrame, *streamCapture) {
	t.Helper()
	var log bytes.Buffer
	capture := newStreamCapture(StreamStdout, limit, newFrameWriter(&log, newFrameKey()))
	for _, w := range writes {
		if n, err := capture.Write(w); n != len(w) || err != nil {
			t.Fatalf("Write returned %d, %v", n, err)
		}
	}
	capture.finish()
	var frames []outputFrame
	for _, line := range strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		var frame outputFrame
		if err := json.Unmarshal([]byte(line), &frame); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		frames = append(frames, frame)
	}
	return frames, capture
}

func joinFrames(frames []outputFrame) string {
	var text strings.Builder
	for _, frame := range frames {
		text.WriteString(frame.Data)
	}
	return text.String()
}

func TestStreamCaptureKeepsASequenceSplitAcrossWritesWhole(t *testing.T) {
	// "€" is E2 82 AC; "😀" is F0 9F 98 80.
	frames, _ := captureFrames(t, 1024, []byte("a\xe2"), []byte("\x82"), []byte("\xacb\xf0\x9f\x98"), []byte("\x80"))

	var data []string
	for _, frame := range frames {
		data = append(data, frame.Data)
	}
	want := []string{"a", "€b", "😀"}
	if strings.Join(data, "|") != strings.Join(want, "|") {
		t.Errorf("frames %q, want %q", data, want)
	}
}

func TestStreamCaptureReplacesEachInvalidByte(t *testing.T) {
	frames, capture := captureFrames(t, 1024, []byte("x\xff\xfey\xc3(z"))

	if got, want := joinFrames(frames), "x\uFFFD\uFFFDy\uFFFD(z"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if capture.Total() != 7 {
		t.Errorf("total %d, want the 7 raw bytes", capture.Total())
	}
}

func TestStreamCaptureReplacesASequenceCutOffByTheEnd(t *testing.T) {
	frames, _ := captureFrames(t, 1024, []byte("end\xe2\x82"))

	if got := joinFrames(frames); got != "end\uFFFD\uFFFD" {
		t.Errorf("text %q", got)
	}
}

func TestStreamCaptureCutsAtTheLimitAndCountsTheRest(t *testing.T) {
	frames, capture := captureFrames(t, 5, []byte("abc"), []byte("de\xe2\x82\xac"), []byte("more"))

	if got := joinFrames(frames); got != "abcde" {
		t.Errorf("kept %q", got)
	}
	if capture.Total() != 12 || !capture.Truncated() {
		t.Errorf("total %d truncated %v", capture.Total(), capture.Truncated())
	}
}

func TestStreamCaptureAtExactlyTheLimitIsNotTruncated(t *testing.T) {
	_, capture := captureFrames(t, 4, []byte("abcd"))

	if capture.Truncated() {
		t.Error("truncated")
	}
}

func TestStreamCaptureSplitsLargeWritesIntoBoundedRecords(t *testing.T) {
	text := strings.Repeat("ab€", 10000)
	frames, _ := captureFrames(t, 1<<20, []byte(text))

	if len(frames) < 2 {
		t.Fatalf("%d frames", len(frames))
	}
	for _, frame := range frames {
		if len(frame.Data) > maxFrameDataBytes || strings.ContainsRune(frame.Data, '\uFFFD') {
			t.Fatalf("frame of %d bytes, or a split sequence", len(frame.Data))
		}
	}
	if joinFrames(frames) != text {
		t.Error("frames do not add up to the text")
	}
}

func TestFrameLinesDoNotEscapeHTML(t *testing.T) {
	line := string(marshalJSONLine(outputFrame{Seq: 1, Stream: StreamStdout, Data: "<a & b>\n", Mac: "00"}))

	if line != `{"seq":1,"stream":"stdout","data":"<a & b>\n","mac":"00"}`+"\n" {
		t.Errorf("line %q", line)
	}
}

func TestCappedBufferKeepsTheFirstBytes(t *testing.T) {
	buffer := &cappedBuffer{limit: 4}
	_, _ = buffer.Write([]byte("abc"))
	_, _ = buffer.Write([]byte("def"))

	if string(buffer.data) != "abcd" || !buffer.Truncated() {
		t.Errorf("data %q truncated %v", buffer.data, buffer.Truncated())
	}
}

// testFrameKey is 00 01 02 ... 1f, the key of the protocol doc's test vectors.
func testFrameKey() []byte {
	key := make([]byte, frameKeyBytes)
	for i := range key {
		key[i] = byte(i)
	}
	return key
}

func TestFrameMACMatchesTheProtocolTestVectors(t *testing.T) {
	// Computed independently with Python's hmac; docs/runner-protocol.md lists them.
	cases := []struct {
		seq          uint64
		stream, data string
		want         string
	}{
		{1, StreamStdout, "hello\n", "a0337636541183ad65d975da99c16a31"},
		{42, StreamStderr, "é\u2028\x01", "f1fc9530ae2fbe9c9b362545b3fb0ff2"},
	}
	for _, tc := range cases {
		if got := frameMAC(testFrameKey(), tc.seq, tc.stream, tc.data); got != tc.want {
			t.Errorf("frameMAC(%d, %s, %q) = %s, want %s", tc.seq, tc.stream, tc.data, got, tc.want)
		}
	}
}

func TestForgedFramesDoNotVerify(t *testing.T) {
	key := testFrameKey()
	genuine := outputFrame{Seq: 3, Stream: StreamStdout, Data: "PASSED\n"}
	genuine.Mac = frameMAC(key, genuine.Seq, genuine.Stream, genuine.Data)
	if !verifyFrame(key, genuine) {
		t.Fatal("a genuine frame does not verify")
	}
	otherKey := newFrameKey()
	forgeries := map[string]outputFrame{
		"other data":   {Seq: 3, Stream: StreamStdout, Data: "FAILED\n", Mac: genuine.Mac},
		"other seq":    {Seq: 4, Stream: StreamStdout, Data: "PASSED\n", Mac: genuine.Mac},
		"other stream": {Seq: 3, Stream: StreamStderr, Data: "PASSED\n", Mac: genuine.Mac},
		"no mac":       {Seq: 3, Stream: StreamStdout, Data: "PASSED\n"},
		"other key":    {Seq: 3, Stream: StreamStdout, Data: "PASSED\n", Mac: frameMAC(otherKey, 3, StreamStdout, "PASSED\n")},
		"upper case":   {Seq: 3, Stream: StreamStdout, Data: "PASSED\n", Mac: strings.ToUpper(genuine.Mac)},
	}
	for name, forged := range forgeries {
		if verifyFrame(key, forged) {
			t.Errorf("%s: a forged frame verifies", name)
		}
	}
}

func TestFrameWriterNumbersFramesAndRevealsItsKeyInTheSummary(t *testing.T) {
	var log bytes.Buffer
	key := newFrameKey()
	frames := newFrameWriter(&log, key)
	frames.writeOutput(StreamStdout, "a", 1<<20)
	frames.writeOutput(StreamStderr, "b", 1<<20)
	if written := frames.writeOutput(StreamStdout, "too long for the room", 10); written != 0 {
		t.Errorf("a frame larger than its room was written (%d bytes)", written)
	}
	summary := frames.summary(Result{ExitCode: intPtr(0)})
	if summary.Frames != 2 || summary.Key != hex.EncodeToString(key) {
		t.Errorf("summary %+v", summary)
	}
	lines := strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n")
	for i, line := range lines {
		var frame outputFrame
		if err := json.Unmarshal([]byte(line), &frame); err != nil || frame.Seq != uint64(i+1) || !verifyFrame(key, frame) {
			t.Errorf("line %d %q does not verify as frame %d", i, line, i+1)
		}
	}
}

// framedBytes is what the frames of a stream take in the pod log.
func framedBytes(frames []outputFrame) int64 {
	var total int64
	for _, frame := range frames {
		total += int64(len(marshalJSONLine(frame)))
	}
	return total
}

func TestStreamCaptureStopsAtTheFramedBudgetForEscapedBytes(t *testing.T) {
	const limit = 64 << 10
	// Each control byte is six bytes framed: \u0001.
	frames, capture := captureFrames(t, limit, bytes.Repeat([]byte{1}, limit))

	if !capture.Truncated() || capture.Total() != limit {
		t.Errorf("truncated %v total %d", capture.Truncated(), capture.Total())
	}
	if framed := framedBytes(frames); framed > framedBudget(limit) || framed < framedBudget(limit)-2*maxFrameDataBytes*6 {
		t.Errorf("framed %d bytes, budget %d", framed, framedBudget(limit))
	}
}

func TestStreamCaptureStopsAtTheFramedBudgetForTinyFrames(t *testing.T) {
	const limit = 4 << 10
	writes := make([][]byte, limit)
	for i := range writes {
		writes[i] = []byte("x")
	}
	frames, capture := captureFrames(t, limit, writes...)

	if !capture.Truncated() || len(frames) >= limit {
		t.Errorf("truncated %v after %d one-byte frames", capture.Truncated(), len(frames))
	}
	if framed := framedBytes(frames); framed > framedBudget(limit) {
		t.Errorf("framed %d bytes, budget %d", framed, framedBudget(limit))
	}
}

func TestStreamCaptureFramesPlainTextUpToTheLimit(t *testing.T) {
	const limit = 1 << 20
	text := bytes.Repeat([]byte("an ordinary line of text\n"), limit/25+1)
	frames, capture := captureFrames(t, limit, text)

	if got := len(joinFrames(frames)); got != limit || capture.Total() != int64(len(text)) {
		t.Errorf("framed %d bytes of %d, want the first %d", got, len(text), limit)
	}
}
