package jetstream

import (
	"iter"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// The stuck watchdog ([kit.Watchdog]) samples what each partition's worker
// already records under its slot's lock when a delivery begins (a count of
// deliveries begun, whether one is in flight, its attempt): it touches no
// hot path. Only this process's deliveries are seen: a handler running in
// another broker is that broker's watchdog's to report. It runs only when
// StuckAfter is set (started by Open, halted by Close once the workers
// have stopped).

// stuckKey is one partition of a local group, as the watchdog knows it.
type stuckKey struct {
	g *group
	s *slot
}

// stuckProbe is the engine's side of the watchdog.
type stuckProbe struct{ e *eng }

// Progress yields every slot of the local groups, each read under its
// lock, yielded outside it.
func (p stuckProbe) Progress() iter.Seq2[stuckKey, kit.Progress] {
	return func(yield func(stuckKey, kit.Progress) bool) {
		for _, g := range p.e.localGroups() {
			for _, s := range g.slots {
				s.mu.Lock()
				pr := s.progressLocked()
				s.mu.Unlock()
				if !yield(stuckKey{g, s}, pr) {
					return
				}
			}
		}
	}
}

// Describe names the delivery in flight on k: its record and consumer, as
// the worker recorded them when it began.
func (p stuckProbe) Describe(k stuckKey, e *engine.Event) {
	k.s.mu.Lock()
	e.Consumer, e.Offset = k.s.consumer, k.s.offset
	if k.s.keyed && k.s.heldRec != nil { // the record holding the window: its key
		e.Record = k.s.heldRec
	}
	k.s.mu.Unlock()
	e.Topic, e.Group, e.Partition = k.g.t.name, k.g.name, k.s.p
}
