package jetstream

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
)

var _ engine.Snapshotter = (*eng)(nil)

// Snapshot describes this broker's topics and the groups it created,
// joined or named ([engine.Snapshotter]), from the server and from its own
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
	topics := slices.Collect(maps.Values(e.topics))
	stopped := e.state == engine.Stopped
	e.mu.Unlock()
	slices.SortFunc(topics, func(a, b *topic) int { return cmp.Compare(a.name, b.name) })
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
			ts.Groups = append(ts.Groups, g.seen.snapshot(r, ts.Partitions))
		}
		snap.Topics = append(snap.Topics, ts)
	}
	snap.Unavailable = r.down && !stopped
	snap.Taken = time.Now()
	return snap
}
