package scsitarget

import "sync/atomic"

// IOBudget bounds the bytes of I/O buffers that commands of every fabric
// hold at once, and each initiator's share of them. A fabric takes a
// command's buffer from a share when the command arrives; when the share
// or the whole budget has no room, it answers TASK SET FULL (SAM-5
// §5.3.1), which initiators retry later. So a peer that floods commands,
// never sends the data it announced or never reads what it asked for
// stalls only itself, and memory stays bounded whatever peers do.
type IOBudget struct {
	total, share int64
	used         atomic.Int64
}

// NewIOBudget returns a budget of total bytes of which one share (an
// iSCSI session, an SRP I_T nexus) may hold share bytes. A command larger
// than a share is admitted when its share holds nothing else.
func NewIOBudget(total, share int64) *IOBudget {
	return &IOBudget{total: total, share: min(share, total)}
}

// Total and ShareLimit are the bounds; Used is what is held now.
func (b *IOBudget) Total() int64      { return b.total }
func (b *IOBudget) ShareLimit() int64 { return b.share }
func (b *IOBudget) Used() int64       { return b.used.Load() }

// IOShare is one initiator's part of an IOBudget.
type IOShare struct {
	b    *IOBudget
	held atomic.Int64
}

// NewShare returns an empty share of b.
func (b *IOBudget) NewShare() *IOShare { return &IOShare{b: b} }

// Take charges n bytes to the share; false: no room now.
func (s *IOShare) Take(n int64) bool {
	if h := s.held.Load(); h > 0 && h+n > s.b.share {
		return false
	}
	if s.b.used.Add(n) > s.b.total {
		s.b.used.Add(-n)
		return false
	}
	s.held.Add(n)
	return true
}

// Give returns n bytes a Take charged.
func (s *IOShare) Give(n int64) {
	s.held.Add(-n)
	s.b.used.Add(-n)
}

// Held is what the share holds now.
func (s *IOShare) Held() int64 { return s.held.Load() }
