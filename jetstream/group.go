package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// priorityGroup is the one priority group of every consumer: with the
// pinned-client policy the server serves one client at a time, whatever
// the members believe about the assignment.
const priorityGroup = "logbus"

var (
	_ engine.Redriver            = (*group)(nil)
	_ engine.DeadLetterReader    = (*group)(nil)
	_ engine.DeadLetterDiscarder = (*group)(nil)
)

// group is a consumer group as this broker sees it: the server holds its
// consumers (one durable consumer per partition), its offsets, its pause
// and its dead letters; this broker holds its local members and their
// workers. What never changes once the group is open is here; its state
// is in parts, each owning its fields behind its own lock (or atomics),
// each in its file:
//
//   - members (membership.go): the local members, the assignment they
//     follow, the membership's health, and the workers they run; the
//     loop that keeps them current (loop.go) is its own.
//   - pause (pause.go): the holds of Pause, and the lock that serialises
//     changes of the consumers' configuration.
//   - letters (dlq.go): the dead-letter stream, and the letters this
//     process made.
//   - redrive (redrive.go): the redrive stream and its consumers.
//   - seen (observed.go): what was last read from the server, and what
//     Close left.
//   - fate (lifecycle.go): whether the group was deleted.
//   - slots (slot.go): each partition's delivery, moved by its worker
//     (worker.go, batch.go).
//   - counts: what this broker's workers did (atomics).
//
// Locks are taken in this order, and never across a server request or
// user code but for recMu and cfgMu, which serialise requests: the
// membership's recMu, then its mu, then a slot's mu; the pause's mu, then
// a slot's mu; the letters' mu alone; the pause's cfgMu with no other.
type group struct {
	e         *eng
	t         *topic
	name      string
	spec      engine.GroupSpec  // as created, resolved
	consumers []natsjs.Consumer // one per partition
	slots     []*slot

	members *membership
	pause   *pausing
	letters *letters
	redrive *redrive
	seen    *observed
	fate    fate
	counts  counts
}

// counts are what this broker's workers (and Redrive calls) did: the
// server keeps no such counters.
type counts struct {
	delivered, retried, deadLettered, skipped, redriven atomic.Int64
	// dropped counts the dead letters this process gave up storing
	// (letters.drop): counted in DeadLettersEvicted.
	dropped atomic.Int64
}

// stats returns the counts, DeadLettersEvicted the letters dropped.
func (c *counts) stats() engine.GroupStats {
	return engine.GroupStats{Delivered: c.delivered.Load(), Retried: c.retried.Load(), DeadLettered: c.deadLettered.Load(),
		Skipped: c.skipped.Load(), Redriven: c.redriven.Load(), DeadLettersEvicted: c.dropped.Load()}
}

// openGroup finds the group's consumers on the server, creating them (and
// its dead-letter and redrive streams) when spec, resolved, is not nil,
// and registers the group in the broker. A nil spec with no consumers is
// ErrSubscription.
func openGroup(ctx context.Context, e *eng, t *topic, name string, spec *engine.GroupSpec) (*group, error) {
	g := &group{e: e, t: t, name: name, consumers: make([]natsjs.Consumer, t.parts), slots: make([]*slot, t.parts)}
	for p := range g.slots {
		g.slots[p] = newSlot(p)
	}
	g.members = newMembership(g)
	g.pause = &pausing{g: g}
	g.seen = newObserved(g)
	g.fate.g = g
	if spec != nil {
		g.spec = *spec
	}
	created := false
	var fresh []leaderOf // the consumers this broker created, whose leaders it spreads
	for p := range t.parts {
		c, err := e.js.Consumer(ctx, e.names.stream(t.name, p), e.names.consumer(name, p))
		if errors.Is(err, natsjs.ErrConsumerNotFound) && spec != nil {
			cfg := g.consumerConfig(p)
			if spec.Start.Kind != engine.StartEarliest {
				// Created paused, until it is moved to its start below: a
				// member of another broker that joins meanwhile must not
				// read from the first record.
				cfg.PauseUntil = &forever
			}
			c, err = e.js.CreateConsumer(ctx, e.names.stream(t.name, p), cfg)
			created = err == nil
			if created {
				fresh = append(fresh, consumerLeader(e.names.stream(t.name, p), c))
			}
		}
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			return nil, fmt.Errorf("no group %q on topic %q: %w", name, t.name, engine.ErrSubscription)
		}
		if err != nil {
			return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
		}
		stored, err := decodeSpec(c.CachedInfo().Config.Metadata)
		if err != nil {
			return nil, fmt.Errorf("group %q partition %d: consumer not made by this version of logbus or an earlier one (%v): %w",
				name, p, err, engine.ErrSubscription)
		}
		if spec == nil {
			g.spec = stored
		} else if !stored.Equal(g.spec) {
			return nil, fmt.Errorf("group %q exists with other options: %w", name, engine.ErrSubscription)
		}
		g.consumers[p] = c
		g.seen.observe(p, c.CachedInfo())
	}
	e.spreadLeaders(ctx, fresh)
	var err error
	if g.letters, err = openLetters(ctx, g); err != nil {
		return nil, e.ctxErr(ctx, fmt.Errorf("group %q: dead-letter stream: %w", name, err))
	}
	if g.redrive, err = openRedrive(ctx, g); err != nil {
		return nil, e.ctxErr(ctx, fmt.Errorf("group %q: redrive stream: %w", name, err))
	}
	g.letters.countedFrom(ctx, g.redrive.rdq.CachedInfo().State)
	if created && spec != nil && spec.Start.Kind != engine.StartEarliest {
		// The consumers deliver from the first record; move them to the
		// start before any member pulls (their members join after this).
		seqs, err := g.startSeqs(ctx, spec.Start)
		if err != nil {
			return nil, err
		}
		for p, seq := range seqs {
			if _, err := t.streams[p].ResetConsumerToSequence(ctx, e.names.consumer(name, p), seq); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: start at %v: %w", name, p, spec.Start, err))
			}
			if _, err := t.streams[p].ResumeConsumer(ctx, e.names.consumer(name, p)); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.groups[groupKey{t.name, name}]; cur != nil { // a concurrent Subscribe won
		return cur, nil
	}
	e.groups[groupKey{t.name, name}] = g
	return g, nil
}

// stream finds or creates a stream of the group's own (its dead letters,
// its redriven letters), stored as its topic's are. One that exists with
// another configuration is updated, keeping its replicas (createStream):
// earlier versions made them otherwise.
func (g *group) stream(ctx context.Context, cfg natsjs.StreamConfig) (natsjs.Stream, error) {
	cfg.Storage = g.t.streamConfig(0).Storage
	return g.e.createStream(ctx, cfg, true)
}

// forever is the end of a pause that lasts until a resume.
var forever = time.Now().Add(100 * 365 * 24 * time.Hour)

// consumerLeader is a consumer of stream just created, for spreadLeaders.
func consumerLeader(stream string, c natsjs.Consumer) leaderOf {
	return leaderOf{stepdown: "CONSUMER.LEADER.STEPDOWN." + stream + "." + c.CachedInfo().Name,
		cluster: c.CachedInfo().Cluster, info: func(ctx context.Context) (*natsjs.ClusterInfo, error) {
			info, err := c.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		}}
}

// consumerConfig is the configuration of the group's consumer on
// partition p, as this broker creates it.
func (g *group) consumerConfig(p int) natsjs.ConsumerConfig {
	return natsjs.ConsumerConfig{
		Durable:        g.e.names.consumer(g.name, p),
		FilterSubject:  g.e.names.subject(g.t.name, p),
		AckPolicy:      natsjs.AckExplicitPolicy,
		AckWait:        g.e.cfg.ackWait,
		MaxDeliver:     -1, // the engine dead-letters; see worker.settle
		MaxAckPending:  maxAckPending(g.spec),
		DeliverPolicy:  natsjs.DeliverAllPolicy,
		PriorityGroups: []string{priorityGroup},
		PriorityPolicy: natsjs.PriorityPolicyPinned,
		PinnedTTL:      g.e.cfg.memberTTL,
		Metadata:       map[string]string{"logbus_group": g.name, metaSpec: encodeSpec(g.spec)},
	}
}

// maxAckPending is how many records of a partition the group's consumer
// lets be unacked: one record in flight per partition (order under
// retries and failover), or with key concurrency the window's size
// (keys.go says why not n). A worker sets it again when it starts
// (worker.run, keyRun.run), so a consumer stored with another value is
// brought in line.
func maxAckPending(spec engine.GroupSpec) int {
	if spec.KeyConcurrency > 1 {
		return engine.KeyWindowSize(spec.KeyConcurrency)
	}
	return 1
}

// startSeqs returns, per partition, the stream sequence start names.
func (g *group) startSeqs(ctx context.Context, start engine.Start) ([]uint64, error) {
	seqs := make([]uint64, g.t.parts)
	for p, s := range g.t.streams {
		info, err := s.Info(ctx)
		if err != nil {
			return nil, g.e.ctxErr(ctx, fmt.Errorf("topic %q partition %d: %w", g.t.name, p, err))
		}
		first, last := info.State.FirstSeq, info.State.LastSeq
		if first == 0 {
			first = 1
		}
		switch start.Kind {
		case engine.StartEarliest:
			seqs[p] = first
		case engine.StartLatest:
			seqs[p] = last + 1
		case engine.StartOffset:
			seqs[p] = min(max(uint64(start.Offset)+1, first), last+1)
		case engine.StartTime:
			seq, err := g.seqAtTime(ctx, s, first, last, start.Time)
			if err != nil {
				return nil, err
			}
			seqs[p] = seq
		}
	}
	return seqs, nil
}

// seqAtTime returns the first sequence in [first, last] stored at or
// after t (last+1 when none): a binary search over the server's
// timestamps.
func (g *group) seqAtTime(ctx context.Context, s natsjs.Stream, first, last uint64, t time.Time) (uint64, error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := s.GetMsg(ctx, mid)
		if errors.Is(err, natsjs.ErrMsgNotFound) { // gone meanwhile: older than anything left
			lo = mid + 1
			continue
		}
		if err != nil {
			return 0, g.e.ctxErr(ctx, fmt.Errorf("topic %q: find time %v: %w", g.t.name, t, err))
		}
		if m.Time.Before(t) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func (g *group) Name() string { return g.name }

// Leave removes consumer (membership.leave).
func (g *group) Leave(ctx context.Context, consumer string) error {
	return g.members.leave(ctx, consumer)
}

// Assignment returns the last assignment computed, over every live member
// of the group in every broker (refreshed on every tick of the loop);
// empty once the group was deleted.
func (g *group) Assignment() map[string][]int { return g.members.assignment() }

// Pause pauses the group on the server for every broker (pausing.pause).
func (g *group) Pause(ctx context.Context) error { return g.pause.pause(ctx) }

// Resume resumes the group on the server (pausing.resume).
func (g *group) Resume(ctx context.Context) error { return g.pause.resume(ctx) }

// Seek moves partition's consumer so that offset is read next.
func (g *group) Seek(ctx context.Context, partition int, offset int64) error {
	if err := g.e.refuse("seek"); err != nil {
		return err
	}
	if err := g.fate.err(); err != nil {
		return err
	}
	if partition < 0 || partition >= g.t.parts {
		return fmt.Errorf("%w: topic %q has no partition %d", engine.ErrInvalid, g.t.name, partition)
	}
	info, err := g.t.streamInfo(ctx, partition)
	if err != nil {
		return g.fate.serverErr(ctx, err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if first == 0 {
		first = 1
	}
	if offset < int64(first)-1 || offset > int64(last) {
		return fmt.Errorf("offset %d outside [%d, %d]: %w", offset, int64(first)-1, last, engine.ErrOffsetOutOfRange)
	}
	return g.reposition(ctx, map[int]uint64{partition: uint64(offset) + 1})
}

// Replay moves every partition's consumer to from.
func (g *group) Replay(ctx context.Context, from engine.Start) error {
	if err := g.e.refuse("replay"); err != nil {
		return err
	}
	if err := g.fate.err(); err != nil {
		return err
	}
	if err := from.Validate(); err != nil {
		return err
	}
	seqs, err := g.startSeqs(ctx, from)
	if err != nil {
		return err
	}
	m := make(map[int]uint64, len(seqs))
	for p, s := range seqs {
		m[p] = s
	}
	return g.reposition(ctx, m)
}

// reposition holds the partitions, waits until this broker's workers for
// them are neither delivering nor pulling, resets the consumers to the
// given sequences on the server, and lets the workers go on from there: a
// record a worker fetched before is dropped (the reset made it moot).
// When ctx ends before the workers are idle, nothing has moved.
func (g *group) reposition(ctx context.Context, seqs map[int]uint64) error {
	ps := make([]int, 0, len(seqs))
	for p := range seqs {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		g.slots[p].hold()
	}
	defer func() {
		for _, p := range ps {
			g.slots[p].unhold()
		}
	}()
	for _, p := range ps {
		if err := g.slots[p].waitIdle(ctx, true); err != nil {
			return fmt.Errorf("nothing moved: %w", err)
		}
	}
	for _, p := range ps {
		// The server does not answer a reset of a consumer that does not
		// exist: ask for it first (a group another broker deleted).
		if _, err := g.seen.consumerInfo(ctx, p); err != nil {
			if gone := g.fate.err(); gone != nil {
				return gone
			}
			return g.e.ctxErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		if _, err := g.t.streams[p].ResetConsumerToSequence(ctx, g.e.names.consumer(g.name, p), seqs[p]); err != nil {
			return g.fate.serverErr(ctx, fmt.Errorf("partition %d: %w", p, err))
		}
		g.slots[p].bumpEpoch(seqs[p])
	}
	return nil
}

// Committed is the offset partition reads next (observed.committed).
func (g *group) Committed(partition int) int64 { return g.seen.committed(partition) }

// Lag is the records the group has yet to commit (observed.lag).
func (g *group) Lag() int64 { return g.seen.lag() }

// Stats counts what this broker's workers did, and Redriven what its
// Redrive calls took; DeadLettersEvicted is the server's count for the
// group, as last observed when the server cannot be asked, plus the
// letters this process could not store (letters.drop).
func (g *group) Stats() engine.GroupStats {
	r, cancel := g.e.read()
	defer cancel()
	return g.seen.stats(r)
}

// DeadLetters reads the group's dead letters, oldest first (letters.all).
func (g *group) DeadLetters() []engine.DeadLetter { return g.letters.all() }

// LatestDeadLetters returns the group's newest n dead letters, newest
// first (letters.latestN).
func (g *group) LatestDeadLetters(ctx context.Context, n int) ([]engine.DeadLetter, error) {
	return g.letters.latestN(ctx, n)
}

// DiscardDeadLetters removes the dead letters match accepts
// (letters.discard).
func (g *group) DiscardDeadLetters(ctx context.Context, match func(*engine.DeadLetter) bool) (int, error) {
	return g.letters.discard(ctx, match)
}

// Redrive sends the dead letters match accepts back to the group
// (redrive.run).
func (g *group) Redrive(ctx context.Context, match func(*engine.DeadLetter) bool) (int, error) {
	return g.redrive.run(ctx, match)
}

// refuseWork is the error of a call, what, that gives the group work to
// do: ErrClosed once Close began (the broker's or the group's), the
// deletion's error once it was deleted, else nil.
func (g *group) refuseWork(what string) error {
	if err := g.e.refuse(what); err != nil {
		return err
	}
	if err := g.fate.err(); err != nil {
		return err
	}
	if g.members.isClosed() {
		return fmt.Errorf("%s: %w", what, engine.ErrClosed)
	}
	return nil
}

// pullFailed takes a worker's failed pull: one that found no consumer
// makes the loop ask whether the group still exists.
func (g *group) pullFailed(err error) {
	if errors.Is(err, errNoConsumer) {
		g.fate.suspect.Store(true)
		g.members.loop.poke()
	}
}

// closePullers ends the partitions' pull subscriptions, for Close, once
// the workers stopped (or Close gave up on them: their pulls then end at
// once).
func (g *group) closePullers() {
	for _, s := range g.slots {
		s.closePullers()
	}
}

// giveBack returns records this broker fetched from slot s's partition
// (or its redrive consumer) and will not deliver, so that whoever owns
// the partition next, in any broker, gets them at once, within its poll
// wait, not after AckWait.
//
// The delivery given back must not count as an attempt: the next owner's
// first delivery of a record is Attempt 1 (the server's delivery count),
// and a Nak would make it 2. So records delivered once (all of them, in
// stream order) are given back by resetting the consumer to the first of
// them, which makes the server forget that they were delivered: it does
// so only when they are all that is unacked and nothing moved the
// consumer since they were fetched (the slot's epoch, the consumer's ack
// floor and last delivered sequence), and the pin, which this broker
// still holds, keeps everyone else's pulls out meanwhile. Otherwise (a
// record being retried, which the server must keep counting; Close gave
// up; the server did not answer) each is Nak'ed: it comes again at once,
// with Attempt+1.
func (g *group) giveBack(s *slot, epoch uint64, msgs ...record) {
	if len(msgs) == 0 {
		return
	}
	if !g.resetTo(s, epoch, msgs) {
		for _, m := range msgs {
			_ = m.Nak()
		}
	}
}

// resetTo is giveBack's reset; false when it did not reset.
func (g *group) resetTo(s *slot, epoch uint64, msgs []record) bool {
	if g.e.handlerCtx.Err() != nil || !g.e.js.Conn().IsConnected() { // a Nak is buffered while reconnecting; requests would wait
		return false
	}
	seqs := make([]uint64, len(msgs))
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != 1 || i > 0 && md.Sequence.Stream <= seqs[i-1] {
			return false
		}
		seqs[i] = md.Sequence.Stream
	}
	redriven := isRedriven(msgs[0])
	if !redriven && s.moved(epoch) {
		return false
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	c, stream, name := g.consumers[s.p], g.t.streams[s.p], g.e.names.consumer(g.name, s.p)
	if redriven {
		c, stream, name = g.redrive.consumers[s.p], g.redrive.rdq, g.e.names.redriveConsumer(s.p)
	}
	info, err := c.Info(ctx)
	if err != nil || info.AckFloor.Stream+1 != seqs[0] || info.Delivered.Stream != seqs[len(seqs)-1] ||
		info.NumAckPending != len(msgs) {
		return false
	}
	_, err = stream.ResetConsumerToSequence(ctx, name, seqs[0])
	return err == nil
}
