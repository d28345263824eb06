package jetstream

import (
	"context"
	"slices"
	"time"

	"github.com/logbus/logbus/internal/engine"
)

var _ engine.Snapshotter = (*eng)(nil)

// Snapshot describes this broker's topics and the groups it created,
// joined or named (engine.Snapshotter), from the server and from its own
// workers. It holds no lock while it asks the server, and asks it, bounded
// by the request timeout, for each partition's stream, each group's
// consumer on it and dead-letter stream, and the oldest uncommitted
// record of each partition with lag; what it cannot read is left zero.
//
// What it cannot know exactly: a delivery in flight or waiting out a
// retry, and its attempt, only for this broker's own workers (a partition
// another broker delivers shows neither), and so RunningFor (with
// WithStuckAfter, else 0); Redriving counts the redriven letters still on
// the server, delivered or not yet; Taken is this process's clock, read
// after the rest, while Oldest is the server's, so lag in time is off by
// the skew between the two clocks. Groups only other brokers use, and
// topics this broker did not create or attach to, are not listed. After
// Close it answers from what Close saw last, without Oldest.
func (e *eng) Snapshot() engine.Snapshot {
	e.mu.Lock()
	topics := make([]*topic, 0, len(e.topics))
	for _, t := range e.topics {
		topics = append(topics, t)
	}
	e.mu.Unlock()
	slices.SortFunc(topics, func(a, b *topic) int { return cmpStr(a.name, b.name) })
	byTopic := map[*topic][]*group{}
	for _, g := range e.localGroups() { // sorted by topic, then name
		byTopic[g.t] = append(byTopic[g.t], g)
	}
	var snap engine.Snapshot
	for _, t := range topics {
		ts := engine.TopicSnapshot{Name: t.name, Partitions: t.Stats()}
		for _, g := range byTopic[t] {
			ts.Groups = append(ts.Groups, g.snapshot(ts.Partitions))
		}
		snap.Topics = append(snap.Topics, ts)
	}
	snap.Taken = time.Now()
	return snap
}

// snapshot describes the group, given its topic's partitions as Stats
// read them.
func (g *group) snapshot(parts []engine.PartitionStats) engine.GroupSnapshot {
	gs := engine.GroupSnapshot{Name: g.name, Stats: g.Stats(),
		Partitions: make([]engine.GroupPartitionSnapshot, g.t.parts)}
	g.mu.Lock()
	gs.Paused = g.paused
	gs.Consumers = slices.Clone(g.order)
	for name, ps := range g.assign {
		for _, p := range ps {
			gs.Partitions[p].Owner = name
		}
	}
	running := make([]bool, g.t.parts)
	for p, s := range g.slots {
		running[p] = s.worker != nil
	}
	g.mu.Unlock()
	for p, s := range g.slots {
		ps := &gs.Partitions[p]
		ps.Partition = p
		s.mu.Lock()
		starts := s.starts
		if running[p] {
			ps.InFlight, ps.Retrying = s.inFlight, s.retrying
			if ps.InFlight || ps.Retrying {
				ps.Attempt = s.attempt
			}
		}
		s.mu.Unlock()
		if ps.InFlight && g.e.stuck != nil {
			ps.RunningFor = g.e.stuck.runningFor(s, starts)
		}
	}

	if snap := g.snap.Load(); snap != nil { // closed: what Close saw last
		gs.DeadLetters = len(snap.letters)
		for p := range gs.Partitions {
			ps := &gs.Partitions[p]
			ps.Committed = snap.committed[p]
			ps.Lag = max(0, parts[p].End-max(ps.Committed, parts[p].Earliest))
		}
		return gs
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	if info, err := g.dlq.Info(ctx); err == nil {
		gs.DeadLetters = int(info.State.Msgs)
	}
	for p, n := range g.redriving(ctx) {
		gs.Partitions[p].Redriving = n
	}
	paused := false
	for p, c := range g.consumers {
		ps := &gs.Partitions[p]
		info, err := c.Info(ctx)
		if err != nil {
			ps.Committed = -1
			continue
		}
		paused = paused || info.Paused
		ps.Committed = int64(info.AckFloor.Stream)
		from := max(ps.Committed, parts[p].Earliest)
		ps.Lag = max(0, parts[p].End-from)
		if ps.Lag > 0 && from == ps.Committed { // the record at Committed is retained
			ps.Oldest = g.created(ctx, p, uint64(ps.Committed)+1)
		}
	}
	gs.Paused = gs.Paused || paused
	return gs
}

// created returns when the record at stream sequence seq of partition p
// was stored; zero when it cannot be read.
func (g *group) created(ctx context.Context, p int, seq uint64) time.Time {
	m, err := g.t.streams[p].GetMsg(ctx, seq)
	if err != nil {
		return time.Time{}
	}
	return m.Time
}
