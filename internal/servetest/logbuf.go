package servetest

import (
	"bytes"
	"sync"
)

// LogBuffer is a log sink (an slog handler's writer) that a test reads
// while the code under test writes to it from several goroutines. The
// zero value is ready.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
