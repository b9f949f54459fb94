package blockcore

import (
	"sync"
	"sync/atomic"
)

// IOBudget bounds the bytes of I/O buffers that commands of every fabric
// hold at once, each initiator's share of them, and each source's — the
// shares of one host (an address, or an IPv6 network: persource) together.
// A fabric takes a command's buffer from a share when the command arrives;
// when the share, its source or the whole budget has no room, it answers
// TASK SET FULL (SAM-5 §5.3.1), which initiators retry later. So a peer
// that floods commands, never sends the data it announced or never reads
// what it asked for stalls only itself — however many sessions it opens —
// and memory stays bounded whatever peers do.
type IOBudget struct {
	total, share, source int64
	used                 atomic.Int64

	// Lock order: mu alone (no other lock is taken under it). It guards
	// sources; Take and Give take no lock.
	mu      sync.Mutex
	sources map[string]*sourceUse

	// Refusals by the bound met (Refusals).
	fullTotal, fullShare, fullSource atomic.Uint64
}

// sourceUse is what the open shares of one source hold together.
type sourceUse struct {
	held   atomic.Int64
	shares int // open shares (guarded by IOBudget.mu)
}

// NewIOBudget returns a budget of total bytes of which one share (an
// iSCSI session, an SRP I_T nexus) may hold share bytes, and the shares
// of one source half the total (but never less than a share). A command
// larger than a share, or than a source's part, is admitted when its
// share, and its source, hold nothing else.
func NewIOBudget(total, share int64) *IOBudget {
	share = min(share, total)
	return &IOBudget{total: total, share: share, source: max(share, total/2), sources: map[string]*sourceUse{}}
}

// Total, ShareLimit and SourceLimit are the bounds; Used is what is held
// now.
func (b *IOBudget) Total() int64       { return b.total }
func (b *IOBudget) ShareLimit() int64  { return b.share }
func (b *IOBudget) SourceLimit() int64 { return b.source }
func (b *IOBudget) Used() int64        { return b.used.Load() }

// Refusals counts the takes refused, by the bound met: the node's budget
// (io_budget), a share's (session_io_budget), a source's
// (source_io_budget).
func (b *IOBudget) Refusals() map[string]uint64 {
	return map[string]uint64{"io_budget": b.fullTotal.Load(), "session_io_budget": b.fullShare.Load(),
		"source_io_budget": b.fullSource.Load()}
}

// sourceCount is how many sources have open shares.
func (b *IOBudget) sourceCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sources)
}

// IOShare is one initiator's part of an IOBudget.
type IOShare struct {
	b    *IOBudget
	src  *sourceUse // nil: counted against no source
	key  string
	held atomic.Int64
	once sync.Once
}

// NewShare returns an empty share of b for an initiator connected from
// source (persource's name of its host; "": none). Close it when the
// session or nexus ends.
func (b *IOBudget) NewShare(source string) *IOShare {
	s := &IOShare{b: b, key: source}
	if source == "" {
		return s
	}
	b.mu.Lock()
	u := b.sources[source]
	if u == nil {
		u = &sourceUse{}
		b.sources[source] = u
	}
	u.shares++
	b.mu.Unlock()
	s.src = u
	return s
}

// Close ends the share: its source is forgotten once none of its shares
// is open. What the share still holds is given back by Give as usual.
func (s *IOShare) Close() {
	if s.src == nil {
		return
	}
	s.once.Do(func() {
		b := s.b
		b.mu.Lock()
		if s.src.shares--; s.src.shares == 0 && b.sources[s.key] == s.src {
			delete(b.sources, s.key)
		}
		b.mu.Unlock()
	})
}

// Take charges n bytes to the share; false: no room now.
func (s *IOShare) Take(n int64) bool {
	b := s.b
	if h := s.held.Load(); h > 0 && h+n > b.share {
		b.fullShare.Add(1)
		return false
	}
	if s.src != nil {
		if v := s.src.held.Add(n); v-n > 0 && v > b.source {
			s.src.held.Add(-n)
			b.fullSource.Add(1)
			return false
		}
	}
	if b.used.Add(n) > b.total {
		b.used.Add(-n)
		if s.src != nil {
			s.src.held.Add(-n)
		}
		b.fullTotal.Add(1)
		return false
	}
	s.held.Add(n)
	return true
}

// Give returns n bytes a Take charged.
func (s *IOShare) Give(n int64) {
	s.held.Add(-n)
	if s.src != nil {
		s.src.held.Add(-n)
	}
	s.b.used.Add(-n)
}

// Held is what the share holds now.
func (s *IOShare) Held() int64 { return s.held.Load() }
