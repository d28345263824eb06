package jetstream

import (
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
)

var _ engine.Snapshotter = (*eng)(nil)

// Snapshot describes this broker's topics and the groups it created,
// joined or named (engine.Snapshotter), from the server and from its own
// workers. It holds no lock while it asks the server, and asks it, bounded
// by the request timeout in all, for each partition's stream, each group's
// consumer on it and dead-letter stream, and the oldest uncommitted
// record of each partition with lag. What it cannot read (the connection
// is down, or a request found the server unreachable: then it stops
// asking) is what it last observed: Unavailable is then set, and each
// topic's and group's Observed says when the oldest of its values was
// read.
//
// What it cannot know exactly: a delivery in flight or waiting out a
// retry, and its attempt, only for this broker's own workers (a partition
// another broker delivers shows neither), and so RunningFor (with
// WithStuckAfter, else 0); Redriving counts the redriven letters still on
// the server, delivered or not yet (0 when it cannot be read); Taken is
// this process's clock, read after the rest, while Oldest is the
// server's, so lag in time is off by the skew between the two clocks.
// Groups only other brokers use, and topics this broker did not create or
// attach to, are not listed. After Close it answers from what Close saw
// last, and Unavailable is not set.
func (e *eng) Snapshot() engine.Snapshot {
	e.mu.Lock()
	topics := make([]*topic, 0, len(e.topics))
	for _, t := range e.topics {
		topics = append(topics, t)
	}
	stopped := e.state == engine.Stopped
	e.mu.Unlock()
	slices.SortFunc(topics, func(a, b *topic) int { return cmpStr(a.name, b.name) })
	byTopic := map[*topic][]*group{}
	for _, g := range e.localGroups() { // sorted by topic, then name
		byTopic[g.t] = append(byTopic[g.t], g)
	}
	r, cancel := e.read()
	defer cancel()
	var snap engine.Snapshot
	for _, t := range topics {
		parts, observed := t.stats(r)
		ts := engine.TopicSnapshot{Name: t.name, Partitions: parts, Observed: observed}
		for _, g := range byTopic[t] {
			ts.Groups = append(ts.Groups, g.snapshot(r, ts.Partitions))
		}
		snap.Topics = append(snap.Topics, ts)
	}
	snap.Unavailable = r.down && !stopped
	snap.Taken = time.Now()
	return snap
}

// snapshot describes the group, given its topic's partitions as Stats
// read them, within the read r.
func (g *group) snapshot(r *reading, parts []engine.PartitionStats) engine.GroupSnapshot {
	gs := engine.GroupSnapshot{Name: g.name, Stats: g.stats(r),
		Partitions: make([]engine.GroupPartitionSnapshot, g.t.parts)}
	g.mu.Lock()
	gs.Paused = g.paused
	gs.Consumers = slices.Clone(g.order)
	gs.MembershipErr, gs.MembershipErrSince = g.health.err(), g.health.since
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
		progress := s.progressLocked()
		if running[p] {
			ps.InFlight, ps.Retrying = s.inFlight, s.retrying
			if ps.InFlight || ps.Retrying {
				ps.Attempt = s.attempt
			}
		}
		s.mu.Unlock()
		if ps.InFlight && g.e.stuck != nil {
			ps.RunningFor = g.e.stuck.RunningFor(stuckKey{g, s}, progress)
		}
	}

	if snap := g.snap.Load(); snap != nil { // closed: what Close saw last
		gs.DeadLetters = len(snap.letters)
		for p := range gs.Partitions {
			ps := &gs.Partitions[p]
			ps.Committed = snap.committed[p]
			ps.Lag = max(0, parts[p].End-max(ps.Committed, parts[p].Earliest))
		}
		gs.Observed = snap.taken
		return gs
	}
	gs.DeadLetters = int(g.lettersSeen.v.Load())
	observed := g.lettersSeen.when()
	if r.ask() && g.gone.Load() == nil {
		for p, n := range g.redriving(r.ctx) {
			gs.Partitions[p].Redriving = n
		}
	}
	paused := false
	for p := range g.consumers {
		ps := &gs.Partitions[p]
		if r.ask() && g.gone.Load() == nil {
			_, err := g.consumerInfo(r.ctx, p)
			r.got(err)
		}
		c := g.consumer(p)
		observed = observedAt(observed, c.at)
		paused = paused || c.paused
		ps.Committed = int64(c.ackFloor)
		from := max(ps.Committed, parts[p].Earliest)
		ps.Lag = max(0, parts[p].End-from)
		if ps.Lag > 0 && from == ps.Committed { // the record at Committed is retained
			ps.Oldest = g.oldest(r, p, uint64(ps.Committed)+1)
		}
	}
	gs.Paused = gs.Paused || paused
	gs.Observed = observed
	return gs
}

// oldestSeen is when the record at seq of a partition was stored: the
// snapshot's Oldest, kept while the group's committed offset stays there.
type oldestSeen struct {
	seq     uint64
	created time.Time
}

// oldest returns when the record at stream sequence seq of partition p
// was stored, within r; zero when it cannot be read.
func (g *group) oldest(r *reading, p int, seq uint64) time.Time {
	if o := g.oldestSeen[p].Load(); o != nil && o.seq == seq {
		return o.created
	}
	if !r.ask() {
		return time.Time{}
	}
	m, err := g.t.streams[p].GetMsg(r.ctx, seq)
	if !r.got(err) {
		return time.Time{}
	}
	g.oldestSeen[p].Store(&oldestSeen{seq: seq, created: m.Time})
	return m.Time
}
