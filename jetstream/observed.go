package jetstream

// The reads of a group's state: from the server, or, while the server
// cannot be asked, what was last read of it; after Close, the snapshot
// Close took.

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// observed is what this broker last read of a group from the server, for
// the reads that take no context (Lag, Committed, Stats, Snapshot), so
// that they serve the last values they observed while the server cannot
// be asked, never made-up ones; and what Close left for the reads after
// it. Atomics: no lock.
type observed struct {
	g         *group
	consumers []atomic.Pointer[consumerSeen] // per partition
	oldest    []atomic.Pointer[oldestSeen]   // per partition
	snap      atomic.Pointer[groupSnap]      // set by Close: what the reads return from then on
}

func newObserved(g *group) *observed {
	return &observed{g: g, consumers: make([]atomic.Pointer[consumerSeen], g.t.parts),
		oldest: make([]atomic.Pointer[oldestSeen], g.t.parts)}
}

// consumerSeen is what the engine last read of a group's consumer on one
// partition.
type consumerSeen struct {
	ackFloor, delivered uint64
	ackPending          int
	paused              bool
	at                  time.Time
}

// oldestSeen is when the record at seq of a partition was stored: the
// snapshot's Oldest, kept while the group's committed offset stays there.
type oldestSeen struct {
	seq     uint64
	created time.Time
}

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

// observe records info as the group's last observed consumer on
// partition p.
func (o *observed) observe(p int, info *natsjs.ConsumerInfo) {
	if info == nil {
		return
	}
	o.consumers[p].Store(&consumerSeen{ackFloor: info.AckFloor.Stream, delivered: info.Delivered.Stream,
		ackPending: info.NumAckPending, paused: info.Paused, at: time.Now()})
}

// consumerInfo reads the group's consumer on partition p from the server,
// and records it; a consumer that is gone makes the group vanish
// (fate.serverErr).
func (o *observed) consumerInfo(ctx context.Context, p int) (*natsjs.ConsumerInfo, error) {
	info, err := o.g.consumers[p].Info(ctx)
	switch {
	case err == nil:
		o.observe(p, info)
	case errors.Is(err, natsjs.ErrConsumerNotFound), errors.Is(err, natsjs.ErrStreamNotFound):
		err = o.g.fate.serverErr(ctx, err) // deleted by another broker
	}
	return info, err
}

// consumer returns the group's consumer on partition p as last observed.
func (o *observed) consumer(p int) *consumerSeen {
	if c := o.consumers[p].Load(); c != nil {
		return c
	}
	return &consumerSeen{}
}

// readPartition reads partition p's stream and the group's consumer on it
// within r, with ask and when r may ask, and returns them as last
// observed.
func (o *observed) readPartition(r *reading, p int, ask bool) (*streamSeen, *consumerSeen) {
	g := o.g
	if ask && r.ask() {
		_, err := g.t.streamInfo(r.ctx, p)
		if r.got(err) {
			_, err = o.consumerInfo(r.ctx, p)
			r.got(err)
		}
	}
	return g.t.stream(p), o.consumer(p)
}

// lagOf is a partition's lag from what was last observed of its stream
// and the group's consumer: from the stream's last sequence down to the
// ack floor, or to the oldest record retained when retention removed the
// ones between.
func lagOf(s *streamSeen, c *consumerSeen) int64 {
	from := max(c.ackFloor, s.first-min(s.first, 1))
	if s.last > from {
		return int64(s.last - from)
	}
	return 0
}

// settled reports whether, as last observed, the consumer had settled
// every record of the stream (see settledTo).
func (c *consumerSeen) settled(s *streamSeen) bool {
	return c.ackFloor >= s.last || c.delivered >= s.last && c.ackPending == 0
}

// committed is the offset partition reads next, from the consumer's ack
// floor on the server: as last observed when the server cannot be asked
// (see lag); -1 when there is no such partition or the group was deleted.
func (o *observed) committed(partition int) int64 {
	g := o.g
	if partition < 0 || partition >= g.t.parts || g.fate.gone() {
		return -1
	}
	if s := o.snap.Load(); s != nil {
		return s.committed[partition]
	}
	r, cancel := g.e.read()
	defer cancel()
	if r.ask() && !g.fate.gone() {
		_, err := o.consumerInfo(r.ctx, partition)
		r.got(err)
	}
	if g.fate.gone() { // found deleted just now
		return -1
	}
	return int64(o.consumer(partition).ackFloor)
}

// lag is the records the group has yet to commit, summed over
// partitions: from each stream's last sequence down to the consumer's ack
// floor, or to the oldest record retained when retention removed the ones
// between (the server's NumPending lags behind publishes). It asks the
// server, bounded by the request timeout; while the server cannot be asked
// (the connection is down, or a request found it unreachable), it serves
// what it last observed of each stream and consumer, never a made-up 0:
// Broker.Snapshot says when that was. 0 once the group was deleted.
func (o *observed) lag() int64 {
	g := o.g
	if g.fate.gone() {
		return 0
	}
	if s := o.snap.Load(); s != nil {
		return s.lag
	}
	r, cancel := g.e.read()
	defer cancel()
	lag, _ := o.lagWithin(r)
	if g.fate.gone() { // found deleted just now
		return 0
	}
	return lag
}

// lagWithin is lag within the read r; it also returns when the oldest of
// the values it used was read.
func (o *observed) lagWithin(r *reading) (int64, time.Time) {
	var lag int64
	var observed time.Time
	for p := range o.g.t.parts {
		s, c := o.readPartition(r, p, !o.g.fate.gone())
		observed = observedAt(observedAt(observed, s.at), c.at)
		lag += lagOf(s, c)
	}
	return lag, observed
}

// stats is the group's Stats within the read r.
func (o *observed) stats(r *reading) engine.GroupStats {
	g := o.g
	st := g.counts.stats()
	if s := o.snap.Load(); s != nil {
		st.DeadLettersEvicted = s.evicted
		return st
	}
	g.letters.readCounts(r)
	st.DeadLettersEvicted += g.letters.evicted.v.Load()
	return st
}

// takeSnap records the group's state for the reads after Close, within
// the read r.
func (o *observed) takeSnap(r *reading) {
	g := o.g
	s := &groupSnap{committed: make([]int64, g.t.parts)}
	ctx, cancel := g.e.ctx()
	s.letters, s.lettersErr = g.letters.latest(ctx, math.MaxInt)
	cancel()
	slices.Reverse(s.letters)
	s.lag, s.taken = o.lagWithin(r)
	for p := range s.committed {
		s.committed[p] = int64(o.consumer(p).ackFloor)
	}
	s.evicted = o.stats(r).DeadLettersEvicted
	s.taken = observedAt(s.taken, g.letters.evicted.when())
	o.snap.Store(s)
}

// stalled says why a group with lag cannot make progress: paused on the
// server, or without a live member anywhere; "" when it can.
func (o *observed) stalled(ctx context.Context, info *natsjs.ConsumerInfo) string {
	if info.Paused {
		return "paused"
	}
	live, err := o.g.members.liveMembers(ctx)
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
func (o *observed) unfinished(r *reading) []engine.Unfinished {
	g := o.g
	if g.members.carriedOn(r) {
		return nil
	}
	var out []engine.Unfinished
	for p := range g.t.parts {
		s, c := o.readPartition(r, p, true)
		if c.settled(s) {
			continue
		}
		out = append(out, engine.Unfinished{Group: g.name, Topic: g.t.name, Partition: p,
			Committed: int64(c.ackFloor), End: int64(s.last), Running: g.slots[p].busyNow()})
	}
	return out
}

// snapshot describes the group, given its topic's partitions as Stats
// read them, within the read r.
func (o *observed) snapshot(r *reading, parts []engine.PartitionStats) engine.GroupSnapshot {
	g := o.g
	gs := engine.GroupSnapshot{Name: g.name, Stats: o.stats(r),
		Partitions: make([]engine.GroupPartitionSnapshot, g.t.parts)}
	running := g.members.describe(&gs)
	keyed := make([]bool, len(g.slots))
	gs.Paused = g.pause.isPaused()
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
		if keyed[p] = s.keyed; s.keyed {
			// The window (keys.go): Attempt and Retrying are its oldest
			// record's, InFlight any delivery.
			ps.InFlight, ps.Running, ps.OldestUnsettled = s.running > 0, s.running, s.oldest
		}
		s.mu.Unlock()
		if ps.InFlight && g.e.stuck != nil {
			ps.RunningFor = g.e.stuck.RunningFor(stuckKey{g, s}, progress)
		}
	}

	if snap := o.snap.Load(); snap != nil { // closed: what Close saw last
		gs.DeadLetters = len(snap.letters)
		for p := range gs.Partitions {
			ps := &gs.Partitions[p]
			ps.Committed = snap.committed[p]
			ps.Lag = max(0, parts[p].End-max(ps.Committed, parts[p].Earliest))
		}
		gs.Observed = snap.taken
		unsettled(gs.Partitions, keyed)
		return gs
	}
	gs.DeadLetters = int(g.letters.held.v.Load())
	observed := g.letters.held.when()
	if r.ask() && !g.fate.gone() {
		for p, n := range g.redrive.waiting(r.ctx) {
			gs.Partitions[p].Redriving = n
		}
	}
	paused := false
	for p := range g.t.parts {
		ps := &gs.Partitions[p]
		if r.ask() && !g.fate.gone() {
			_, err := o.consumerInfo(r.ctx, p)
			r.got(err)
		}
		c := o.consumer(p)
		observed = observedAt(observed, c.at)
		paused = paused || c.paused
		ps.Committed = int64(c.ackFloor)
		from := max(ps.Committed, parts[p].Earliest)
		ps.Lag = max(0, parts[p].End-from)
		if ps.Lag > 0 && from == ps.Committed { // the record at Committed is retained
			ps.Oldest = o.oldestAt(r, p, uint64(ps.Committed)+1)
		}
	}
	gs.Paused = gs.Paused || paused
	gs.Observed = observed
	unsettled(gs.Partitions, keyed)
	return gs
}

// unsettled fills each partition's Running and OldestUnsettled from this
// broker's delivery of it, once Committed is known, but for a keyed one,
// whose window said them (keys.go): a delivery in flight or waiting out
// its backoff is of the record at the committed offset, the server's ack
// floor (one record unacked at a time: MaxAckPending 1); -1 when there is
// none.
func unsettled(parts []engine.GroupPartitionSnapshot, keyed []bool) {
	for i := range parts {
		ps := &parts[i]
		if keyed[i] {
			continue
		}
		ps.OldestUnsettled = -1
		if ps.InFlight || ps.Retrying {
			ps.OldestUnsettled = ps.Committed
		}
		if ps.InFlight {
			ps.Running = 1
		}
	}
}

// oldestAt returns when the record at stream sequence seq of partition p
// was stored, within r; zero when it cannot be read.
func (o *observed) oldestAt(r *reading, p int, seq uint64) time.Time {
	if old := o.oldest[p].Load(); old != nil && old.seq == seq {
		return old.created
	}
	if !r.ask() {
		return time.Time{}
	}
	m, err := o.g.t.streams[p].GetMsg(r.ctx, seq)
	if !r.got(err) {
		return time.Time{}
	}
	o.oldest[p].Store(&oldestSeen{seq: seq, created: m.Time})
	return m.Time
}
