package runner

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// nodeKernelPath is the node session kernel the node image ships
// (images/node/kernel.mjs). A variable only so that tests can point at the
// repository's copy.
var nodeKernelPath = "/opt/sandpod/node/kernel.mjs"

// nodeSourceExtensions are the source files the node kernel runs: JavaScript,
// and TypeScript, whose types it strips first.
var nodeSourceExtensions = []string{".js", ".mjs", ".cjs", ".ts", ".mts", ".cts"}

// usesNodeKernel reports whether a session of cfg runs in the node kernel:
// the command is [node, flags…, sourceFile] and the image has the kernel.
func usesNodeKernel(cfg Config) bool {
	count := len(cfg.Command)
	if count < 2 || filepath.Base(cfg.Command[0]) != "node" || cfg.Command[count-1] != cfg.SourceFile ||
		!slices.Contains(nodeSourceExtensions, filepath.Ext(cfg.SourceFile)) {
		return false
	}
	for _, flag := range cfg.Command[1 : count-1] {
		if !strings.HasPrefix(flag, "-") {
			return false
		}
	}
	_, err := os.Stat(nodeKernelPath)
	return err == nil
}

// nodeKernelArgv is what the waiting shim execs for a node session: the
// command's node and flags running the kernel, which gets the source file's
// name (its extension says TypeScript or not).
func nodeKernelArgv(cfg Config) []string {
	argv := slices.Clone(cfg.Command[:len(cfg.Command)-1])
	// The kernel uses Node's type stripping and vm's main-context loader, both experimental in Node 24.
	if !slices.Contains(argv, "--disable-warning=ExperimentalWarning") {
		argv = append(argv, "--disable-warning=ExperimentalWarning")
	}
	return append(argv, nodeKernelPath, cfg.SourceFile)
}

// newRunMark is a run's mark: random, so that nothing the program wrote
// before its run can pass for it.
func newRunMark() string {
	var random [16]byte
	_, _ = rand.Read(random[:])
	return "\x00sandpod-run-" + hex.EncodeToString(random[:]) + "\x00"
}

// markedOutput is one of a node kernel's output pipes, read for the kernel's
// life: what the kernel writes between a run's two marks goes to that run's
// writer, anything else (between runs) nowhere.
type markedOutput struct {
	mu     sync.Mutex
	mark   []byte
	target io.Writer
	// forwarding: the start mark was read, the end mark not yet.
	forwarding bool
	// held is the tail of what was read that may be the start of a mark.
	held []byte
	// ended is closed when the run's end mark was read or the pipe ended.
	ended  chan struct{}
	closed bool
}

// readMarked reads pipe until it ends, for the kernel's life.
func readMarked(pipe *os.File) *markedOutput {
	output := &markedOutput{ended: make(chan struct{})}
	close(output.ended)
	go func() {
		defer pipe.Close()
		drain(pipe, output)
		output.mu.Lock()
		defer output.mu.Unlock()
		output.closed = true
		output.endRun()
	}()
	return output
}

// begin sends what the kernel writes after mark to target, until mark again.
func (m *markedOutput) begin(mark string, target io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mark, m.target, m.forwarding, m.held = []byte(mark), target, false, nil
	m.ended = make(chan struct{})
	if m.closed {
		close(m.ended)
	}
}

// finish waits, at most grace, for the run's end mark; then nothing more
// goes to the run's writer.
func (m *markedOutput) finish(grace time.Duration) {
	m.mu.Lock()
	ended := m.ended
	m.mu.Unlock()
	select {
	case <-ended:
	case <-time.After(grace):
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forwarding {
		_, _ = m.target.Write(m.held)
	}
	m.endRun()
}

// endRun stops forwarding; mu is held.
func (m *markedOutput) endRun() {
	m.forwarding, m.target, m.held = false, nil, nil
	select {
	case <-m.ended:
	default:
		close(m.ended)
	}
}

func (m *markedOutput) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.target == nil {
		return len(p), nil
	}
	data := append(m.held, p...)
	m.held = nil
	if !m.forwarding {
		start := bytes.Index(data, m.mark)
		if start == -1 {
			m.held = heldTail(data, m.mark)
			return len(p), nil
		}
		m.forwarding = true
		data = data[start+len(m.mark):]
	}
	if end := bytes.Index(data, m.mark); end != -1 {
		_, _ = m.target.Write(data[:end])
		m.endRun()
		return len(p), nil
	}
	held := heldTail(data, m.mark)
	_, _ = m.target.Write(data[:len(data)-len(held)])
	m.held = held
	return len(p), nil
}

// heldTail is the end of data that may be the first bytes of mark: from its
// last NUL (a mark's first byte) among the last len(mark)-1 bytes, if any.
func heldTail(data, mark []byte) []byte {
	tail := data[len(data)-min(len(data), len(mark)-1):]
	start := bytes.LastIndexByte(tail, mark[0])
	if start == -1 || !bytes.HasPrefix(mark, tail[start:]) {
		return nil
	}
	return slices.Clone(tail[start:])
}
