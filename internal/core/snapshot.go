package core

import (
	"cmp"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// Snapshot copies the state of every topic and group (see
// engine.Snapshotter). It takes the broker's lock to list them, then each
// partition's and each group's lock in turn, each only to copy a few
// fields; it never waits for a worker. Taken is read from the clock that
// measures ages (the injected clock, or else time.Now), before anything
// else, so no lag in time it implies is negative.
func (b *Broker) Snapshot() engine.Snapshot {
	snap := engine.Snapshot{Taken: b.ageClock.Now()}
	b.mu.Lock()
	topics := make([]*Topic, 0, len(b.topics))
	for _, t := range b.topics {
		topics = append(topics, t)
	}
	byTopic := make(map[*Topic][]*Group, len(topics))
	for _, g := range b.groups {
		byTopic[g.topic] = append(byTopic[g.topic], g)
	}
	b.mu.Unlock()
	slices.SortFunc(topics, func(x, y *Topic) int { return cmp.Compare(x.name, y.name) })
	for _, t := range topics {
		ts := engine.TopicSnapshot{Name: t.name, Partitions: t.Stats()}
		groups := byTopic[t]
		slices.SortFunc(groups, func(x, y *Group) int { return cmp.Compare(x.name, y.name) })
		for _, g := range groups {
			ts.Groups = append(ts.Groups, g.snapshot(b.stuck))
		}
		snap.Topics = append(snap.Topics, ts)
	}
	return snap
}

// snapshot copies the group's state. stuck, when not nil, knows how long
// the deliveries in flight have run.
func (g *Group) snapshot(stuck *kit.Watchdog[stuckKey]) engine.GroupSnapshot {
	gs := engine.GroupSnapshot{Name: g.name, Stats: g.Stats(), Partitions: make([]engine.GroupPartitionSnapshot, len(g.parts))}
	gs.DeadLetters, _ = g.dlq.counts()
	g.mu.Lock()
	gs.Paused = g.paused
	for _, m := range g.members {
		gs.Consumers = append(gs.Consumers, m.name)
	}
	for i, gp := range g.parts {
		if gp.owner != nil {
			gs.Partitions[i].Owner = gp.owner.name
		}
	}
	g.mu.Unlock()
	for i, gp := range g.parts {
		ps := &gs.Partitions[i]
		ps.Partition = gp.index
		state, attempt, _ := unpackProgress(gp.progress.Load())
		ps.InFlight, ps.Retrying = state == InFlight, state == RetryScheduled
		if ps.InFlight || ps.Retrying {
			ps.Attempt = attempt
		}
		ps.Committed = gp.cursor.Committed()
		ps.Lag, ps.Oldest = gp.part.lagFrom(ps.Committed)
		ps.Redriving = gp.redriving()
		switch {
		case gp.keys != nil:
			ps.Running, ps.OldestUnsettled = int(gp.keys.running.Load()), gp.keys.oldest.Load()
		case ps.InFlight || ps.Retrying:
			ps.OldestUnsettled = ps.Committed
			if ps.InFlight {
				ps.Running = 1
			}
		default:
			ps.OldestUnsettled = -1
		}
		if stuck != nil && ps.InFlight {
			ps.RunningFor = stuck.RunningFor(stuckKey{g, gp}, gp.watched())
		}
	}
	return gs
}

// lagFrom returns how many records lie from offset to the end, and when
// the one at offset was created: zero when there is none, or when it is
// no longer retained.
func (p *Partition) lagFrom(offset int64) (int64, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lag := max(0, p.next-offset)
	if lag == 0 || offset < p.base {
		return lag, time.Time{}
	}
	// Under mu a record between base and next is retained, so nobody
	// recycles it while we read it.
	return lag, p.ring.load(offset).Created
}
