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
				if !yield(stuckKey{g, gp}, gp.watched()) {
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

// watched is what the watchdog samples of gp. With key concurrency the
// progress word describes the record holding the window, the oldest
// unsettled one, and its count of acks moves with every other key: the
// watchdog sees the committed offset in its place, so that a delivery
// holding the window is reported however much the other keys do.
func (gp *groupPartition) watched() kit.Progress {
	word := gp.progress.Load()
	if gp.keys != nil {
		word = uint64(gp.cursor.Committed())<<progressAcks | word&(1<<progressAcks-1)
	}
	return progressOf(word)
}

// Describe names the delivery in flight on k: the record at the committed
// offset (or a redriven letter), since the worker commits each before the
// next, or with key concurrency commits up to the oldest unsettled one;
// and the partition's owner, read under the group's lock. With key
// concurrency the event carries that record's key (a copy, in Record):
// the key holding the window.
func (p stuckProbe) Describe(k stuckKey, e *engine.Event) {
	e.Topic, e.Group, e.Partition, e.Offset = k.g.topic.name, k.g.name, k.gp.index, k.gp.cursor.Committed()
	if k.gp.keys != nil {
		if rec, ok := k.gp.keys.held(e.Offset); ok {
			e.Record = rec
		}
	}
	k.g.mu.Lock()
	if k.gp.owner != nil {
		e.Consumer = k.gp.owner.name
	}
	k.g.mu.Unlock()
}
