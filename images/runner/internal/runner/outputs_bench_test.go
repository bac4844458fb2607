package runner

import (
	"io"
	"testing"
)

// BenchmarkCollectOutputs measures collecting a work directory's files at the
// default limits: next to a 10 GiB sparse file (skipped by its size, never
// read) and among 10,000 files (stopped at the file limit). The tests check
// what is collected; this is where the time goes:
// go test -run '^$' -bench CollectOutputs ./internal/runner/
func BenchmarkCollectOutputs(b *testing.B) {
	b.Run("huge-sparse-file", func(b *testing.B) {
		benchmarkCollect(b, hugeSparseFileDir(b))
	})
	b.Run("ten-thousand-files", func(b *testing.B) {
		benchmarkCollect(b, tenThousandFilesDir(b))
	})
}

func benchmarkCollect(b *testing.B, dir string) {
	for b.Loop() {
		collectOutputs(dir, outputsConfig(), newFrameWriter(io.Discard, testFrameKey()))
	}
}
