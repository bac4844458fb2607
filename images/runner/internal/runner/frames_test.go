package runner

import (
	"bytes"
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
