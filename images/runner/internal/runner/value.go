package runner

import (
	"io"
	"strings"
	"syscall"
	"time"
)

// maxReportedValueBytes bounds what is read from the python bootstrap's
// channel: its repr, cut to 65,537 characters, is at most four times that.
const maxReportedValueBytes = 1 << 20

// valueReader collects what the python bootstrap (pythonBootstrap) reports on
// its channel while the program runs: the repr of the trailing expression's
// value. The program can write there too; the value is the program's word.
type valueReader struct {
	channel io.ReadCloser
	buffer  cappedBuffer
	done    chan struct{}
}

func readValue(channel io.ReadCloser) *valueReader {
	r := &valueReader{channel: channel, buffer: cappedBuffer{limit: maxReportedValueBytes}, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_, _ = io.Copy(&r.buffer, channel)
	}()
	return r
}

// value waits for the channel's end, or closes it past drainGrace (only a
// process the runner could not kill still holds it then), and returns what
// came, or nil when nothing did or more than the bootstrap ever writes.
func (r *valueReader) value() *string {
	select {
	case <-r.done:
	case <-time.After(drainGrace):
	}
	_ = r.channel.Close()
	<-r.done
	if len(r.buffer.data) == 0 || r.buffer.Truncated() {
		return nil
	}
	text := strings.ToValidUTF8(string(r.buffer.data), "\uFFFD")
	return &text
}

// setValue records the reported value, kept only when the program then
// exited 0 by itself (outside sessions, a null value is left out).
func (r *Result) setValue(value *string) {
	if value != nil && r.ExitCode != nil && *r.ExitCode == 0 {
		r.Value = &programValue{Text: boundValue(value)}
	}
}

// shutdownWrite ends the runner's writing on a socket it keeps reading.
func shutdownWrite(conn syscall.Conn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var shutdownErr error
	if err := raw.Control(func(fd uintptr) { shutdownErr = syscall.Shutdown(int(fd), syscall.SHUT_WR) }); err != nil {
		return err
	}
	return shutdownErr
}
