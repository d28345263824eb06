package core

import (
	"maps"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
)

// The events of engine.Observer, raised where they happen and always after
// the lock of that place is released: the observer is the typed layer's
// hooks and logger, which is user code. With no observer each costs a nil
// check.

type (
	Observer  = engine.Observer
	Event     = engine.Event
	EventKind = engine.EventKind
)

// trims is what a partition had dropped and expired when it took its lock,
// so that unlock can tell the observer what the locked section trimmed.
type trims struct{ dropped, expired int64 }

// trimsLocked notes the partition's trim counters.
func (p *Partition) trimsLocked() trims { return trims{p.stats.Dropped, p.stats.Expired} }

// unlockReporting releases mu, then tells the observer what was dropped
// and expired since before was noted.
func (p *Partition) unlockReporting(before trims) {
	if p.obs == nil {
		p.mu.Unlock()
		return
	}
	dropped, expired := p.stats.Dropped-before.dropped, p.stats.Expired-before.expired
	p.mu.Unlock()
	if dropped > 0 {
		p.obs.Observe(&Event{Kind: engine.EventDrop, Topic: p.topic, Partition: p.index, Count: dropped})
	}
	if expired > 0 {
		p.obs.Observe(&Event{Kind: engine.EventExpire, Topic: p.topic, Partition: p.index, Count: expired})
	}
}

// observe tells the observer, if any, of a backpressure event.
func (p *Partition) observeBackpressure(kind EventKind, waited time.Duration, err error) {
	if p.obs != nil {
		p.obs.Observe(&Event{Kind: kind, Topic: p.topic, Partition: p.index, Delay: waited, Err: err})
	}
}

// assignmentLocked is the group's assignment, for a rebalance event.
func (g *Group) assignmentLocked() map[string][]int {
	out := make(map[string][]int, len(g.members))
	for _, m := range g.members {
		out[m.name] = []int{}
	}
	for i, gp := range g.parts {
		if gp.owner != nil {
			out[gp.owner.name] = append(out[gp.owner.name], i)
		}
	}
	return out
}

// observedAssignmentLocked is the group's assignment when something
// observes the broker, else nil: what a rebalance starts from.
func (g *Group) observedAssignmentLocked() map[string][]int {
	if g.broker.obs == nil {
		return nil
	}
	return g.assignmentLocked()
}

// rebalanceEvent is the event of a rebalance from before to the group's
// assignment now, or nil when nothing observes or nothing moved. The
// caller holds mu, and raises it (observe) after releasing it.
func (g *Group) rebalanceEventLocked(before map[string][]int) *Event {
	if g.broker.obs == nil {
		return nil
	}
	after := g.assignmentLocked()
	if maps.EqualFunc(before, after, slices.Equal) {
		return nil
	}
	return &Event{Kind: engine.EventRebalance, Topic: g.topic.name, Group: g.name, Before: before, After: after}
}

// observe raises e, when not nil. The caller holds no lock.
func (g *Group) observe(e *Event) {
	if e != nil {
		g.broker.obs.Observe(e)
	}
}
