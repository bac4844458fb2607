package runner

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// BenchmarkPrint1 measures python `print(1)` from the request to its first
// output frame and to its summary: warm is POST /v1/run to a serving runner
// whose interpreter is pre-started; cold is a one-off runner started for the
// run (python3 main.py), from its start. The numbers are in
// docs/runner-protocol.md:
// go test -run '^$' -bench Print1 -benchtime 20x ./internal/runner/
func BenchmarkPrint1(b *testing.B) {
	b.Run("warm", func(b *testing.B) {
		var firstFrame, summary time.Duration
		for range b.N {
			b.StopTimer()
			s := newPythonFixture(b, "print(1)\n").serve()
			request := s.request("exec-1")
			b.StartTimer()
			started := time.Now()
			response := s.post(request, s.bearer())
			lines := bufio.NewReader(response.Body)
			if _, err := lines.ReadBytes('\n'); err != nil || response.StatusCode != http.StatusOK {
				b.Fatalf("status %d: %v", response.StatusCode, err)
			}
			firstFrame += time.Since(started)
			if _, err := io.ReadAll(lines); err != nil {
				b.Fatal(err)
			}
			summary += time.Since(started)
			b.StopTimer()
			s.terminate()
		}
		reportLatencies(b, firstFrame, summary)
	})
	b.Run("cold", func(b *testing.B) {
		var firstFrame, summary time.Duration
		for range b.N {
			b.StopTimer()
			f := newPythonFixture(b, "print(1)\n")
			f.writeInputs()
			log := &firstWriteClock{}
			b.StartTimer()
			log.started = time.Now()
			if _, err := Run(context.Background(), f.opts, log); err != nil {
				b.Fatal(err)
			}
			summary += time.Since(log.started)
			firstFrame += log.first
		}
		reportLatencies(b, firstFrame, summary)
	})
}

func reportLatencies(b *testing.B, firstFrame, summary time.Duration) {
	b.ReportMetric(float64(firstFrame.Microseconds())/1000/float64(b.N), "ms-to-first-frame")
	b.ReportMetric(float64(summary.Microseconds())/1000/float64(b.N), "ms-to-summary")
}

// firstWriteClock discards what is written and notes when the first write
// came, counted from started.
type firstWriteClock struct {
	once    sync.Once
	started time.Time
	first   time.Duration
}

func (c *firstWriteClock) Write(p []byte) (int, error) {
	c.once.Do(func() { c.first = time.Since(c.started) })
	return len(p), nil
}
