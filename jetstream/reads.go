package jetstream

// The reads of a group's state: from the server, or, after Close, from
// the snapshot Close took.

import (
	"context"
	"math"
	"slices"

	"github.com/logbus/logbus/internal/engine"
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
}

// takeSnap records the group's state for the reads after Close.
func (g *group) takeSnap() {
	s := &groupSnap{committed: make([]int64, g.t.parts), lag: g.Lag()}
	ctx, cancel := g.e.ctx()
	s.letters, s.lettersErr = g.latest(ctx, math.MaxInt)
	cancel()
	slices.Reverse(s.letters)
	for p := range s.committed {
		s.committed[p] = g.Committed(p)
	}
	s.evicted = g.Stats().DeadLettersEvicted
	g.snap.Store(s)
}

// Committed is the offset partition reads next, from the consumer's ack
// floor on the server; -1 when the server cannot be asked.
func (g *group) Committed(partition int) int64 {
	if partition < 0 || partition >= g.t.parts {
		return 0
	}
	if s := g.snap.Load(); s != nil {
		return s.committed[partition]
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	info, err := g.consumers[partition].Info(ctx)
	if err != nil {
		return -1
	}
	return int64(info.AckFloor.Stream)
}

// Lag is the records the group has yet to commit, summed over
// partitions: from each stream's last sequence down to the consumer's ack
// floor, or to the oldest record retained when retention removed the ones
// between (the server's NumPending lags behind publishes).
func (g *group) Lag() int64 {
	if s := g.snap.Load(); s != nil {
		return s.lag
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	var lag int64
	for p, c := range g.consumers {
		sinfo, err := g.t.streams[p].Info(ctx)
		if err != nil {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil {
			continue
		}
		from := max(info.AckFloor.Stream, sinfo.State.FirstSeq-min(sinfo.State.FirstSeq, 1))
		if sinfo.State.LastSeq > from {
			lag += int64(sinfo.State.LastSeq - from)
		}
	}
	return lag
}

// Stats counts what this broker's workers did, and Redriven what its
// Redrive calls took; DeadLettersEvicted is the server's count for the
// group, plus the letters this process could not store (dlq.go's
// dropLetter).
func (g *group) Stats() engine.GroupStats {
	st := engine.GroupStats{Delivered: g.delivered.Load(), Retried: g.retried.Load(), DeadLettered: g.deadLettered.Load(), Skipped: g.skipped.Load(),
		Redriven: g.redriven.Load(), DeadLettersEvicted: g.dropped.Load()}
	if s := g.snap.Load(); s != nil {
		st.DeadLettersEvicted = s.evicted
		return st
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	// Every letter the stream ever stored is still there, evicted, taken
	// by Redrive, which stored one copy of it in the redrive stream (a
	// work queue: its last sequence counts every copy ever stored), or
	// removed by DiscardDeadLetters, which counts them in the deal bucket.
	if info, err := g.dlq.Info(ctx); err == nil {
		gone := int64(info.State.LastSeq) - int64(info.State.Msgs)
		if rinfo, err := g.rdq.Info(ctx); err == nil {
			gone -= int64(rinfo.State.LastSeq)
		}
		gone -= g.discarded(ctx)
		st.DeadLettersEvicted += max(0, gone)
	}
	return st
}

// stalled says why a group with lag cannot make progress: paused on the
// server, or without a live member anywhere; "" when it can.
func (g *group) stalled(ctx context.Context, info *natsjs.ConsumerInfo) string {
	if info.Paused {
		return "paused"
	}
	live, _, err := g.liveMembers(ctx)
	if err == nil && len(live) == 0 {
		return "without consumers"
	}
	return ""
}

// unfinished lists the partitions where the group has not committed
// everything, for Close's ShutdownError.
//
// A group that has live members in other brokers is not left behind: they
// go on with its partitions, so it has none here.
func (g *group) unfinished(ctx context.Context) []engine.Unfinished {
	if live, _, err := g.liveMembers(ctx); err == nil {
		g.mu.Lock()
		others := 0
		for _, name := range live {
			if g.members[name] == nil {
				others++
			}
		}
		g.mu.Unlock()
		if others > 0 {
			return nil
		}
	}
	var out []engine.Unfinished
	for p, c := range g.consumers {
		sinfo, err := g.t.streams[p].Info(ctx)
		if err != nil {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil || settledTo(info, sinfo.State.LastSeq) {
			continue
		}
		out = append(out, engine.Unfinished{Group: g.name, Topic: g.t.name, Partition: p,
			Committed: int64(info.AckFloor.Stream), End: int64(sinfo.State.LastSeq), Running: g.slots[p].busyNow()})
	}
	return out
}
