package core

import (
	"iter"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// The stuck watchdog (kit.Watchdog) samples the progress word each worker
// already stores per delivery (state, attempt and acks in one word, see
// groupPartition.progress): it touches no hot path. It runs only when
// Config.StuckAfter is set (started by NewBroker, halted by Close once the
// workers exited); without it nothing samples and nothing ticks.

// stuckKey is one partition of a group, as the watchdog knows it.
type stuckKey struct {
	g  *Group
	gp *groupPartition
}

// stuckProbe is the broker's side of the watchdog.
type stuckProbe struct{ b *Broker }

// Progress yields every registered group's partitions. A deleted group's
// are not: the watchdog forgets them.
func (p stuckProbe) Progress() iter.Seq2[stuckKey, kit.Progress] {
	return func(yield func(stuckKey, kit.Progress) bool) {
		for _, g := range p.b.groupList() {
			for _, gp := range g.parts {
				if !yield(stuckKey{g, gp}, progressOf(gp.progress.Load())) {
					return
				}
			}
		}
	}
}

// progressOf is a progress word as the watchdog samples it: the word
// changes with every attempt and every ack.
func progressOf(word uint64) kit.Progress {
	state, attempt, _ := unpackProgress(word)
	return kit.Progress{Word: word, InFlight: state == InFlight, Attempt: attempt}
}

// Describe names the delivery in flight on k: the record at the committed
// offset (or a redriven letter), since the worker commits each before the
// next, and the partition's owner, read under the group's lock.
func (p stuckProbe) Describe(k stuckKey, e *engine.Event) {
	e.Topic, e.Group, e.Partition, e.Offset = k.g.topic.name, k.g.name, k.gp.index, k.gp.cursor.Committed()
	k.g.mu.Lock()
	if k.gp.owner != nil {
		e.Consumer = k.gp.owner.name
	}
	k.g.mu.Unlock()
}
