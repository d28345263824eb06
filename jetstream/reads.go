package jetstream

// The reads of a group's state: from the server, or, after Close, from
// the snapshot Close took.

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// groupSnap is a group's state as Close left it: after Close the reads
// (Committed, Lag, Stats, DeadLetters) answer from it, since the
// connection may be gone.
type groupSnap struct {
	committed []int64
	lag       int64
	evicted   int64
	letters   []engine.DeadLetter // oldest first; the newest, when the read was cut short
	// lettersErr says why letters is short: the server did not answer in
	// time.
	lettersErr error
	taken      time.Time // when the oldest of these values was read from the server
}

// takeSnap records the group's state for the reads after Close, within
// the read r.
func (g *group) takeSnap(r *reading) {
	s := &groupSnap{committed: make([]int64, g.t.parts)}
	ctx, cancel := g.e.ctx()
	s.letters, s.lettersErr = g.latest(ctx, math.MaxInt)
	cancel()
	slices.Reverse(s.letters)
	s.lag, s.taken = g.lag(r)
	for p := range s.committed {
		s.committed[p] = int64(g.consumer(p).ackFloor)
	}
	s.evicted = g.stats(r).DeadLettersEvicted
	s.taken = observedAt(s.taken, g.evictedSeen.when())
	g.snap.Store(s)
}

// Committed is the offset partition reads next, from the consumer's ack
// floor on the server: as last observed when the server cannot be asked
// (see Lag); -1 when there is no such partition or the group was deleted.
func (g *group) Committed(partition int) int64 {
	if partition < 0 || partition >= g.t.parts || g.gone.Load() != nil {
		return -1
	}
	if s := g.snap.Load(); s != nil {
		return s.committed[partition]
	}
	r, cancel := g.e.read()
	defer cancel()
	if r.ask() && g.gone.Load() == nil {
		_, err := g.consumerInfo(r.ctx, partition)
		r.got(err)
	}
	if g.gone.Load() != nil { // found deleted just now
		return -1
	}
	return int64(g.consumer(partition).ackFloor)
}

// Lag is the records the group has yet to commit, summed over
// partitions: from each stream's last sequence down to the consumer's ack
// floor, or to the oldest record retained when retention removed the ones
// between (the server's NumPending lags behind publishes). It asks the
// server, bounded by the request timeout; while the server cannot be asked
// (the connection is down, or a request found it unreachable), it serves
// what it last observed of each stream and consumer, never a made-up 0:
// Broker.Snapshot says when that was. 0 once the group was deleted.
func (g *group) Lag() int64 {
	if g.gone.Load() != nil {
		return 0
	}
	if s := g.snap.Load(); s != nil {
		return s.lag
	}
	r, cancel := g.e.read()
	defer cancel()
	lag, _ := g.lag(r)
	if g.gone.Load() != nil { // found deleted just now
		return 0
	}
	return lag
}

// lag is Lag within the read r; it also returns when the oldest of the
// values it used was read.
func (g *group) lag(r *reading) (int64, time.Time) {
	var lag int64
	var observed time.Time
	for p := range g.consumers {
		if r.ask() && g.gone.Load() == nil {
			_, err := g.t.streamInfo(r.ctx, p)
			if r.got(err) {
				_, err = g.consumerInfo(r.ctx, p)
				r.got(err)
			}
		}
		s, c := g.t.stream(p), g.consumer(p)
		observed = observedAt(observedAt(observed, s.at), c.at)
		lag += lagOf(s, c)
	}
	return lag, observed
}

// Stats counts what this broker's workers did, and Redriven what its
// Redrive calls took; DeadLettersEvicted is the server's count for the
// group, as last observed when the server cannot be asked, plus the
// letters this process could not store (dlq.go's dropLetter).
func (g *group) Stats() engine.GroupStats {
	r, cancel := g.e.read()
	defer cancel()
	return g.stats(r)
}

// stats is Stats within the read r.
func (g *group) stats(r *reading) engine.GroupStats {
	st := engine.GroupStats{Delivered: g.delivered.Load(), Retried: g.retried.Load(), DeadLettered: g.deadLettered.Load(), Skipped: g.skipped.Load(),
		Redriven: g.redriven.Load(), DeadLettersEvicted: g.dropped.Load()}
	if s := g.snap.Load(); s != nil {
		st.DeadLettersEvicted = s.evicted
		return st
	}
	g.readLetterCounts(r)
	st.DeadLettersEvicted += g.evictedSeen.v.Load()
	return st
}

// readLetterCounts reads, within r, how many dead letters the group holds
// and how many were evicted, into lettersSeen and evictedSeen.
func (g *group) readLetterCounts(r *reading) {
	if !r.ask() || g.gone.Load() != nil {
		return
	}
	// Every letter the stream ever stored is still there, evicted, taken
	// by Redrive, which stored one copy of it in the redrive stream (a
	// work queue: its last sequence counts every copy ever stored), or
	// removed by DiscardDeadLetters, which counts them in the deal bucket.
	info, err := g.dlq.Info(r.ctx)
	if !r.got(err) {
		return
	}
	g.lettersSeen.store(int64(info.State.Msgs))
	gone := int64(info.State.LastSeq) - int64(info.State.Msgs)
	rinfo, err := g.rdq.Info(r.ctx)
	if !r.got(err) {
		return
	}
	gone -= int64(rinfo.State.LastSeq) + g.discarded(r.ctx)
	g.evictedSeen.store(max(0, gone))
}

// stalled says why a group with lag cannot make progress: paused on the
// server, or without a live member anywhere; "" when it can.
func (g *group) stalled(ctx context.Context, info *natsjs.ConsumerInfo) string {
	if info.Paused {
		return "paused"
	}
	live, err := g.liveMembers(ctx)
	if err == nil && len(live) == 0 {
		return "without consumers"
	}
	return ""
}

// unfinished lists the partitions where the group has not committed
// everything, for Close's ShutdownError: from the server, within r, or as
// last observed when it cannot be asked.
//
// A group that has live members in other brokers is not left behind: they
// go on with its partitions, so it has none here.
func (g *group) unfinished(r *reading) []engine.Unfinished {
	if g.carriedOn(r) {
		return nil
	}
	var out []engine.Unfinished
	for p := range g.consumers {
		if r.ask() {
			_, err := g.t.streamInfo(r.ctx, p)
			if r.got(err) {
				_, err = g.consumerInfo(r.ctx, p)
				r.got(err)
			}
		}
		s, c := g.t.stream(p), g.consumer(p)
		if c.settled(s) {
			continue
		}
		out = append(out, engine.Unfinished{Group: g.name, Topic: g.t.name, Partition: p,
			Committed: int64(c.ackFloor), End: int64(s.last), Running: g.slots[p].busyNow()})
	}
	return out
}

// carriedOn reports whether the group has live members in other brokers:
// from the membership bucket, within r, or as the last reconcile saw them
// when it cannot be asked.
func (g *group) carriedOn(r *reading) bool {
	var live []string
	asked := false
	if r.ask() {
		l, err := g.liveMembers(r.ctx)
		if asked = r.got(err); asked {
			live = l
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !asked {
		live = g.order
	}
	for _, name := range live {
		if g.members[name] == nil {
			return true
		}
	}
	return false
}

// drainedByClose returns the partitions Close drains for the group: nil
// for every one, unless the group has live members in other brokers (as
// the last reconcile saw them), which carry on: then only those this
// broker's members own.
func (g *group) drainedByClose() map[int]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	others := false
	for _, name := range g.order {
		others = others || g.members[name] == nil
	}
	if !others {
		return nil
	}
	mine := map[int]bool{}
	for name, ps := range g.assign {
		if g.members[name] != nil {
			for _, p := range ps {
				mine[p] = true
			}
		}
	}
	return mine
}
